//go:build linux

package reaper

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"

	"github.com/containerd/errdefs"
)

// maxEarly bounds the exits of unknown children kept for adoptions.
const maxEarly = 256

// Adoption is the window in which a process that the reaper did not start
// becomes its child and is registered: a grandchild reparented to the
// agent when its parent exits, as runc's container processes are when
// `runc create` or `runc exec --detach` returns. Such a process may exit
// before its pid is known (read from runc's pid file); as long as the
// adoption is open, the reaper keeps the status of every unknown child it
// collects, so Adopt still finds it.
//
// Open the Adoption before starting the parent, Adopt the pid once the
// parent has exited, and call Done in every case.
type Adoption struct {
	r    *Reaper
	once sync.Once
}

// Expect opens an Adoption.
func (r *Reaper) Expect() *Adoption {
	r.mu.Lock()
	r.expecting++
	r.mu.Unlock()
	return &Adoption{r: r}
}

// Adopt registers pid, which must be a child of this process by now (its
// parent exited and it was reparented here), and returns it as a Child.
// If the reaper already collected it, the Child is returned exited.
func (a *Adoption) Adopt(pid int) (*Child, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("adopt pid %d: %w", pid, errdefs.ErrInvalidArgument)
	}
	r := a.r
	r.mu.Lock()
	if r.children[pid] != nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("pid %d is already registered: %w", pid, errdefs.ErrAlreadyExists)
	}
	c := &Child{pid: pid, done: make(chan struct{})}
	if e, ok := r.early[pid]; ok {
		r.dropEarlyLocked(pid)
		r.mu.Unlock()
		c.mu.Lock()
		c.setExitLocked(e)
		c.mu.Unlock()
		return c, nil
	}
	// Not collected yet, so it is alive or a zombie: its parent must be
	// us, or nobody here can ever see its exit.
	if ppid, err := parentOf(pid); err == nil && ppid != os.Getpid() {
		r.mu.Unlock()
		return nil, fmt.Errorf("pid %d is a child of %d, not of this process (the agent must be PID 1 or a child subreaper): %w",
			pid, ppid, errdefs.ErrFailedPrecondition)
	}
	r.children[pid] = c
	r.mu.Unlock()
	// It may have exited, and its SIGCHLD been consumed by a pass that
	// did not know it yet.
	r.wake()
	return c, nil
}

// Done closes the adoption window. Safe to call more than once.
func (a *Adoption) Done() {
	a.once.Do(func() {
		r := a.r
		r.mu.Lock()
		defer r.mu.Unlock()
		r.expecting--
		if r.expecting == 0 {
			r.early, r.earlyOrder = nil, nil
		}
	})
}

func (r *Reaper) keepEarlyLocked(pid int, e Exit) {
	if r.early == nil {
		r.early = make(map[int]Exit)
	}
	if _, ok := r.early[pid]; ok {
		r.dropEarlyLocked(pid)
	}
	if len(r.earlyOrder) >= maxEarly {
		delete(r.early, r.earlyOrder[0])
		r.earlyOrder = r.earlyOrder[1:]
	}
	r.early[pid] = e
	r.earlyOrder = append(r.earlyOrder, pid)
}

func (r *Reaper) dropEarlyLocked(pid int) {
	delete(r.early, pid)
	for i, p := range r.earlyOrder {
		if p == pid {
			r.earlyOrder = append(r.earlyOrder[:i], r.earlyOrder[i+1:]...)
			break
		}
	}
}

// parentOf reads pid's parent from /proc.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name is in parentheses and may hold anything; the
	// fields after its closing parenthesis are state and ppid.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return strconv.Atoi(string(f[1]))
}
