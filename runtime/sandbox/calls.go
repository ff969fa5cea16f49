package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
)

// callGate counts the container calls in flight, so that Stop lets them
// finish before the VM goes: a Kill whose signal ended the container's
// last process must still get its answer, although the exit it caused
// can make the shim stop the sandbox before that answer is back.
type callGate struct {
	mu sync.Mutex
	n  int
	// closed refuses new calls once Stop began.
	closed bool
	// idle is closed when n drops to 0 after closing; nil before.
	idle chan struct{}
}

// enter admits a call; the caller runs leave when it is done. It fails
// once the sandbox is stopping.
func (g *callGate) enter(what string) (leave func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("%s: the sandbox is stopping: %w", what, errdefs.ErrUnavailable)
	}
	g.n++
	return g.leave, nil
}

func (g *callGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.n == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// close refuses new calls and waits, up to max or until ctx ends, for
// those in flight. It reports how many were still running when it gave
// up.
func (g *callGate) close(ctx context.Context, max time.Duration) int {
	g.mu.Lock()
	g.closed = true
	if g.n == 0 {
		g.mu.Unlock()
		return 0
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	idle := g.idle
	g.mu.Unlock()
	timer := time.NewTimer(max)
	defer timer.Stop()
	select {
	case <-idle:
	case <-timer.C:
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}
