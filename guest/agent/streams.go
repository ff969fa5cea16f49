//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/hashicorp/yamux"

	"github.com/cocoonrt/cocoon/guest/api"
)

// sessionEnd returns a channel closed when the agent session that c is a
// stream of ends: a stdio stream whose session ended is not the host's
// choice to stop, and its process waits for AttachProcess instead. nil
// (never closed) for a conn that is no session's stream.
func sessionEnd(c net.Conn) <-chan struct{} {
	if st, ok := c.(interface{ Session() *yamux.Session }); ok {
		return st.Session().CloseChan()
	}
	return nil
}

// streamSet holds the streams of one id by kind: a process's stdio, or
// an export's layer stream.
type streamSet map[api.StreamKind]net.Conn

func (s streamSet) closeAll() {
	for _, c := range s {
		_ = c.Close()
	}
}

type streamKey struct {
	id   string
	kind api.StreamKind
}

// parkedStream is a stream that arrived before the call naming it
// (StartProcess, CreateContainer, ExecProcess, ExportLayer, DialPort).
type parkedStream struct {
	conn  net.Conn
	timer *time.Timer
}

// claim is a call waiting for the streams it names.
type claim struct {
	want map[api.StreamKind]bool
	got  streamSet
	// ready is closed once got holds every wanted kind; complete says
	// it was. Both are guarded by streamRegistry.mu, like got.
	ready    chan struct{}
	complete bool
}

// streamRegistry pairs the streams the host opens with the calls that
// name them, in whichever order the two arrive.
type streamRegistry struct {
	// parkTimeout is how long an unclaimed stream is kept.
	parkTimeout time.Duration
	// maxParked bounds unclaimed streams; more are refused.
	maxParked int

	// mu guards parked and claims.
	mu     sync.Mutex
	parked map[streamKey]*parkedStream
	claims map[string]*claim
}

func newStreamRegistry(parkTimeout time.Duration, maxParked int) *streamRegistry {
	return &streamRegistry{
		parkTimeout: parkTimeout,
		maxParked:   maxParked,
		parked:      make(map[streamKey]*parkedStream),
		claims:      make(map[string]*claim),
	}
}

// deliver hands an arrived stdio stream to the process waiting for it, or
// parks it for a StartProcess still to come. It takes ownership of conn.
func (r *streamRegistry) deliver(id string, kind api.StreamKind, conn net.Conn) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cl := r.claims[id]; cl != nil {
		if !cl.want[kind] {
			_ = conn.Close()
			return fmt.Errorf("process %s did not ask for a %s stream: %w", id, kind, errdefs.ErrInvalidArgument)
		}
		if abandoned(conn) {
			_ = conn.Close()
			return fmt.Errorf("%s stream for process %s closed by the host before use: %w", kind, id, errdefs.ErrFailedPrecondition)
		}
		if old := cl.got[kind]; old != nil {
			if !abandoned(old) {
				_ = conn.Close()
				return fmt.Errorf("process %s already has a %s stream: %w", id, kind, errdefs.ErrAlreadyExists)
			}
			_ = old.Close()
		}
		cl.got[kind] = conn
		if len(cl.got) == len(cl.want) && !cl.complete {
			cl.complete = true
			close(cl.ready)
		}
		return nil
	}
	key := streamKey{id, kind}
	if old := r.parked[key]; old != nil {
		if !abandoned(old.conn) {
			_ = conn.Close()
			return fmt.Errorf("a %s stream for process %s is already waiting: %w", kind, id, errdefs.ErrAlreadyExists)
		}
		old.timer.Stop()
		_ = old.conn.Close()
		delete(r.parked, key)
	}
	if len(r.parked) >= r.maxParked {
		_ = conn.Close()
		return fmt.Errorf("%d stdio streams wait for their process: %w", len(r.parked), errdefs.ErrResourceExhausted)
	}
	p := &parkedStream{conn: conn}
	p.timer = time.AfterFunc(r.parkTimeout, func() { r.expire(key, p) })
	r.parked[key] = p
	return nil
}

func (r *streamRegistry) expire(key streamKey, p *parkedStream) {
	r.mu.Lock()
	if r.parked[key] != p {
		r.mu.Unlock()
		return
	}
	delete(r.parked, key)
	r.mu.Unlock()
	_ = p.conn.Close()
}

// claim waits until every stream kind in want has arrived for id, at most
// timeout, and returns them. On error no stream is left behind.
func (r *streamRegistry) claim(ctx context.Context, id string, want []api.StreamKind, timeout time.Duration) (streamSet, error) {
	cl := &claim{want: make(map[api.StreamKind]bool, len(want)), got: make(streamSet, len(want)), ready: make(chan struct{})}
	for _, k := range want {
		cl.want[k] = true
	}
	r.mu.Lock()
	if r.claims[id] != nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("process %s is already waiting for its streams: %w", id, errdefs.ErrAlreadyExists)
	}
	// Take what arrived early; a parked stream of a kind the process did
	// not ask for is a host error and is dropped.
	for _, kind := range []api.StreamKind{api.StreamStdin, api.StreamStdout, api.StreamStderr, api.StreamLayer, api.StreamPort} {
		key := streamKey{id, kind}
		p := r.parked[key]
		if p == nil {
			continue
		}
		delete(r.parked, key)
		p.timer.Stop()
		if cl.want[kind] && !abandoned(p.conn) {
			cl.got[kind] = p.conn
		} else {
			_ = p.conn.Close()
		}
	}
	if len(cl.got) == len(cl.want) {
		r.mu.Unlock()
		return cl.got, nil
	}
	r.claims[id] = cl
	r.mu.Unlock()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var err error
	select {
	case <-cl.ready:
	case <-timer.C:
		err = fmt.Errorf("streams of %s did not arrive within %s: %w", id, timeout, errdefs.ErrFailedPrecondition)
	case <-ctx.Done():
		err = fmt.Errorf("waiting for the streams of %s: %w", id, ctx.Err())
	}
	r.mu.Lock()
	delete(r.claims, id)
	got := cl.got
	r.mu.Unlock()
	if err != nil {
		// ready may have closed meanwhile; the streams are released either way.
		got.closeAll()
		return nil, err
	}
	return got, nil
}

// close drops every parked stream.
func (r *streamRegistry) close() {
	r.mu.Lock()
	parked := r.parked
	r.parked = make(map[streamKey]*parkedStream)
	r.mu.Unlock()
	for _, p := range parked {
		p.timer.Stop()
		_ = p.conn.Close()
	}
}

// abandoned reports whether the host has already closed its side of a
// stdio stream that no process uses yet. The host sends nothing on these
// streams before StartProcess succeeds, and closes them when it fails, so
// a closed one is left over from a failed start of the same id and must
// not be handed to a new process. The probe reads nothing: a zero-length
// read with a past deadline fails with something other than a timeout
// only if the peer has closed (EOF) or reset the stream.
func abandoned(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Unix(1, 0))
	_, err := c.Read(nil)
	_ = c.SetReadDeadline(time.Time{})
	if err == nil {
		return false
	}
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}
