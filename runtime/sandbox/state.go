package sandbox

import (
	"fmt"
	"sync"

	"github.com/containerd/errdefs"
)

// Phase is where a sandbox's VM is in its lifecycle. Every change of phase
// goes through lifecycle.to, which refuses the transitions the table
// below does not list.
//
//	Booting ──▶ Ready ◀──▶ Paused ◀──▶ Saving
//	Restoring ──▶ Ready      │           │
//	  every phase but Stopped ──▶ Stopping ──▶ Stopped
//	  Ready, Paused, Saving ──▶ Dead ──▶ Stopping
//
// Booting and Restoring end in Ready or, on failure, in Stopping. Dead is
// a VM that ended without being asked to (QEMU crashed or was killed, the
// agent session broke, the guest sent garbage or stopped answering): its
// processes are gone, and what is left on the host is released by Stop.
type Phase uint8

const (
	// PhaseBooting: the VMM was launched; the agent has not answered yet.
	PhaseBooting Phase = iota + 1
	// PhaseRestoring: the VMM is loading a snapshot (checkpoint or
	// template); the guest resumes in Ready.
	PhaseRestoring
	// PhaseReady: the agent answers; containers can be made and driven.
	PhaseReady
	// PhasePaused: the VM's vCPUs are stopped; the guest answers nothing
	// until it is resumed.
	PhasePaused
	// PhaseSaving: a snapshot of the paused VM is being written.
	PhaseSaving
	// PhaseDead: the VM ended on its own, or was ended because its guest
	// could no longer be trusted or reached.
	PhaseDead
	// PhaseStopping: Stop is ending the VM and releasing what it used.
	PhaseStopping
	// PhaseStopped: nothing of the sandbox is left.
	PhaseStopped
)

func (p Phase) String() string {
	switch p {
	case PhaseBooting:
		return "booting"
	case PhaseRestoring:
		return "restoring"
	case PhaseReady:
		return "ready"
	case PhasePaused:
		return "paused"
	case PhaseSaving:
		return "saving a snapshot"
	case PhaseDead:
		return "dead"
	case PhaseStopping:
		return "stopping"
	case PhaseStopped:
		return "stopped"
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// transitions lists, for each phase, the phases it may change to.
var transitions = map[Phase][]Phase{
	PhaseBooting:   {PhaseReady, PhaseStopping},
	PhaseRestoring: {PhaseReady, PhaseStopping},
	PhaseReady:     {PhasePaused, PhaseDead, PhaseStopping},
	PhasePaused:    {PhaseReady, PhaseSaving, PhaseDead, PhaseStopping},
	PhaseSaving:    {PhasePaused, PhaseDead, PhaseStopping},
	PhaseDead:      {PhaseStopping},
	PhaseStopping:  {PhaseStopped},
	PhaseStopped:   nil,
}

func (p Phase) canBecome(to Phase) bool {
	for _, ok := range transitions[p] {
		if ok == to {
			return true
		}
	}
	return false
}

// lifecycle holds a sandbox's phase. The zero value is not ready: use
// newLifecycle.
type lifecycle struct {
	// mu guards phase and cause.
	mu    sync.Mutex
	phase Phase
	// cause says why the sandbox died; set on entering PhaseDead.
	cause error
	// dead is closed by ended once a dead sandbox's VM is gone (see
	// Sandbox.die); ended on entering PhaseStopping, whichever way the
	// sandbox got there.
	dead     chan struct{}
	deadOnce sync.Once
	ended    chan struct{}
}

func newLifecycle(p Phase) *lifecycle {
	return &lifecycle{phase: p, dead: make(chan struct{}), ended: make(chan struct{})}
}

// current returns the phase and, for a dead sandbox, why it died.
func (l *lifecycle) current() (Phase, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.phase, l.cause
}

// to changes the phase to next if the table allows it, else it returns
// an ErrFailedPrecondition error that says what the sandbox is.
func (l *lifecycle) to(next Phase) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.toLocked(next)
}

func (l *lifecycle) toLocked(next Phase) error {
	if !l.phase.canBecome(next) {
		return fmt.Errorf("the sandbox cannot become %s: it is %s: %w", next, l.phase, errdefs.ErrFailedPrecondition)
	}
	l.phase = next
	if next == PhaseStopping {
		close(l.ended)
	}
	return nil
}

// buried closes dead: the VM of the dead sandbox is gone, and so are its
// processes.
func (l *lifecycle) buried() { l.deadOnce.Do(func() { close(l.dead) }) }

// die moves a live sandbox to PhaseDead with cause and reports whether it
// did: false if the sandbox is not live (still booting, already dead, or
// being stopped), in which case whoever owns that phase deals with the
// VM's end.
func (l *lifecycle) die(cause error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.phase.canBecome(PhaseDead) {
		return false
	}
	l.cause = cause
	_ = l.toLocked(PhaseDead)
	return true
}

// stop moves the sandbox to PhaseStopping from any phase but Stopping and
// Stopped, and reports whether the caller is the one to stop it.
func (l *lifecycle) stop() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.toLocked(PhaseStopping) == nil
}

// require returns nil if the sandbox is in one of the phases ok, else an
// error naming what could not be done (doing) and why: ErrUnavailable for
// a sandbox that is dead or ending, ErrFailedPrecondition for one that is
// not ready yet or is paused.
func (l *lifecycle) require(doing string, ok ...Phase) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range ok {
		if l.phase == p {
			return nil
		}
	}
	switch l.phase {
	case PhaseDead:
		return fmt.Errorf("cannot %s: the sandbox's VM is gone (%v): %w", doing, l.cause, errdefs.ErrUnavailable)
	case PhaseStopping, PhaseStopped:
		return fmt.Errorf("cannot %s: the sandbox is %s: %w", doing, l.phase, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("cannot %s: the sandbox is %s: %w", doing, l.phase, errdefs.ErrFailedPrecondition)
}
