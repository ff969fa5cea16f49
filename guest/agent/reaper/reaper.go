//go:build linux

// Package reaper collects the exit status of the agent's child processes.
//
// As PID 1 the agent inherits every orphan in the guest, so something must
// wait for them or they stay zombies forever. One reaper per agent does all
// waiting: it is woken by SIGCHLD, and it alone calls wait4. Processes the
// agent starts are registered with it and learn their status from it;
// anything else it reaps is an orphan and is dropped silently. Nothing else
// in the agent may wait for children (exec.Cmd.Wait included): two waiters
// race, and whichever loses never sees the status.
//
// With Options.Orphans off the reaper waits only for the pids registered
// with it, which is what an agent that is not PID 1 (a test, a debugging
// run) needs so that it leaves its host's other children alone.
package reaper

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"time"
	"unsafe"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Options tune a Reaper.
type Options struct {
	// Orphans makes the reaper also collect children it did not start.
	// Set it when the process is PID 1 or a child subreaper, where
	// orphans are reparented to it.
	Orphans bool
}

// Reaper waits for child processes. It is safe for concurrent use.
type Reaper struct {
	orphans bool
	// kick asks the reap loop for a pass; buffered so kicks coalesce.
	kick chan struct{}
	sigs chan os.Signal
	stop chan struct{}
	done chan struct{}

	// mu guards children, expecting and early. Start holds it from fork
	// until the pid is registered, so an orphan-collecting pass that sees
	// the new pid blocks until it can tell that the pid is ours.
	mu       sync.Mutex
	children map[int]*Child
	// expecting counts open Adoptions. While it is positive, the exits
	// of unknown children are kept in early instead of dropped.
	expecting int
	// early holds exits of unknown children collected while an adoption
	// was expected, oldest first in earlyOrder; bounded by maxEarly.
	early      map[int]Exit
	earlyOrder []int
}

// New starts a reaper. Close stops it.
func New(opts Options) *Reaper {
	r := &Reaper{
		orphans:  opts.Orphans,
		kick:     make(chan struct{}, 1),
		sigs:     make(chan os.Signal, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		children: make(map[int]*Child),
	}
	signal.Notify(r.sigs, unix.SIGCHLD)
	go r.loop()
	// Children may have exited before SIGCHLD was routed to us.
	r.wake()
	return r
}

// Close stops the reaper. Children still registered never see their exit.
func (r *Reaper) Close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
	signal.Stop(r.sigs)
}

// Start runs start, which must create exactly one child process and return
// its pid, and registers that child. The caller must not wait for the child
// itself.
func (r *Reaper) Start(start func() (int, error)) (*Child, error) {
	r.mu.Lock()
	pid, err := start()
	if err != nil {
		r.mu.Unlock()
		return nil, err
	}
	c := &Child{pid: pid, done: make(chan struct{})}
	r.children[pid] = c
	r.mu.Unlock()
	// The child may have exited, and its SIGCHLD been consumed by a pass
	// that did not know it yet.
	r.wake()
	return c, nil
}

// Running reports how many registered children have not been reaped.
func (r *Reaper) Running() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.children)
}

func (r *Reaper) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *Reaper) loop() {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			return
		case <-r.sigs:
		case <-r.kick:
		}
		r.reap()
	}
}

func (r *Reaper) reap() {
	if !r.orphans {
		r.mu.Lock()
		children := make([]*Child, 0, len(r.children))
		for _, c := range r.children {
			children = append(children, c)
		}
		r.mu.Unlock()
		for _, c := range children {
			if c.tryReap() {
				r.forget(c)
			}
		}
		return
	}
	for {
		pid, err := peekExited()
		if err != nil || pid <= 0 {
			// ECHILD: no children at all; 0: none has exited yet.
			return
		}
		r.mu.Lock()
		c := r.children[pid]
		if c == nil {
			// An orphan: collect it so it does not stay a zombie. The
			// lock is held so that an Adopt of this pid either
			// registered it before (c != nil) or finds it in early.
			var ws unix.WaitStatus
			got, _ := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			if got == pid && r.expecting > 0 {
				r.keepEarlyLocked(pid, Exit{WaitStatus: ws, At: time.Now()})
			}
			r.mu.Unlock()
			continue
		}
		r.mu.Unlock()
		if c.tryReap() {
			r.forget(c)
			continue
		}
		// wait4 for a pid that waitid reported exited found nothing:
		// someone else reaped it (a forbidden second waiter). Drop it so
		// the loop cannot spin.
		c.markLost()
		r.forget(c)
	}
}

func (r *Reaper) forget(c *Child) {
	r.mu.Lock()
	if r.children[c.pid] == c {
		delete(r.children, c.pid)
	}
	r.mu.Unlock()
}

// sigchldInfo is the head of siginfo_t as the kernel fills it for
// SIGCHLD-class information (waitid). x/sys/unix leaves the union opaque.
type sigchldInfo struct {
	Signo int32
	Errno int32
	Code  int32
	_     [unsafe.Sizeof(uintptr(0)) - 4]byte // the union is pointer-aligned
	Pid   int32
	UID   uint32
	_     [128 - 3*4 - unsafe.Sizeof(uintptr(0)) + 4 - 2*4]byte
}

// peekExited returns the pid of an exited child without reaping it, so that
// the child's lock can be taken before its pid is released for reuse.
func peekExited() (int, error) {
	var info sigchldInfo
	if unsafe.Sizeof(info) != unsafe.Sizeof(unix.Siginfo{}) {
		return 0, errors.New("siginfo layout mismatch")
	}
	for {
		err := unix.Waitid(unix.P_ALL, 0, (*unix.Siginfo)(unsafe.Pointer(&info)), unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		return int(info.Pid), nil
	}
}

// Exit is how a child ended.
type Exit struct {
	// WaitStatus is the raw status from wait4.
	WaitStatus unix.WaitStatus
	// At is when the reaper collected the status.
	At time.Time
	// Lost is set when the status was taken by another waiter; the exit
	// code is then unknown and reported as 255.
	Lost bool
}

// Status is the exit status as runc reports it: the exit code, or 128 plus
// the number of the signal that ended the process (137 for SIGKILL).
func (e Exit) Status() uint32 {
	switch {
	case e.Lost:
		return 255
	case e.WaitStatus.Signaled():
		return 128 + uint32(e.WaitStatus.Signal())
	case e.WaitStatus.Exited():
		return uint32(e.WaitStatus.ExitStatus())
	}
	return 255
}

// Signal is the signal that ended the process, or 0 if it exited.
func (e Exit) Signal() unix.Signal {
	if !e.Lost && e.WaitStatus.Signaled() {
		return e.WaitStatus.Signal()
	}
	return 0
}

// Child is a process registered with a Reaper.
type Child struct {
	pid  int
	done chan struct{}

	// mu guards exit and exited. It is held across wait4 for this pid and
	// across signalling it: while it is held and exited is false, pid still
	// names this child (alive or a zombie), never a recycled pid.
	mu     sync.Mutex
	exited bool
	exit   Exit
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.pid }

// Done is closed once the child has been reaped.
func (c *Child) Done() <-chan struct{} { return c.done }

// Exit returns how the child ended; valid once Done is closed.
func (c *Child) Exit() Exit {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exit
}

// Signal sends sig to the child, or with group to its process group (whose
// id is the child's pid, for children that start their own group or
// session). A group outlives its leader, so group signals are delivered
// after the child exited as long as members remain.
func (c *Child) Signal(sig unix.Signal, group bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if group {
		// The kernel keeps a pid number out of reuse while it names a live
		// process group, so -pid is safe even after the leader is gone.
		if err := unix.Kill(-c.pid, sig); err != nil {
			if err == unix.ESRCH {
				return fmt.Errorf("process group %d: %w", c.pid, errdefs.ErrNotFound)
			}
			return fmt.Errorf("signal process group %d: %w", c.pid, err)
		}
		return nil
	}
	if c.exited {
		return fmt.Errorf("process %d already exited: %w", c.pid, errdefs.ErrNotFound)
	}
	if err := unix.Kill(c.pid, sig); err != nil {
		return fmt.Errorf("signal process %d: %w", c.pid, err)
	}
	return nil
}

// tryReap collects the child if it has exited and reports whether it did.
func (c *Child) tryReap() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exited {
		return true
	}
	var ws unix.WaitStatus
	for {
		pid, err := unix.Wait4(c.pid, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err == unix.ECHILD {
			c.setExitLocked(Exit{Lost: true, At: time.Now()})
			return true
		}
		if err != nil || pid != c.pid {
			return false
		}
		c.setExitLocked(Exit{WaitStatus: ws, At: time.Now()})
		return true
	}
}

func (c *Child) markLost() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.exited {
		c.setExitLocked(Exit{Lost: true, At: time.Now()})
	}
}

func (c *Child) setExitLocked(e Exit) {
	c.exit = e
	c.exited = true
	close(c.done)
}
