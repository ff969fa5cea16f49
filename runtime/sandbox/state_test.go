package sandbox

import (
	"errors"
	"testing"

	"github.com/containerd/errdefs"
)

// TestPhaseTransitions holds lifecycle.to to the table, and each refusal
// to ErrFailedPrecondition with a sentence naming both phases.
func TestPhaseTransitions(t *testing.T) {
	all := []Phase{PhaseBooting, PhaseRestoring, PhaseReady, PhasePaused, PhaseSaving, PhaseDead, PhaseStopping, PhaseStopped}
	for _, from := range all {
		for _, to := range all {
			l := newLifecycle(from)
			err := l.to(to)
			if from.canBecome(to) {
				if err != nil {
					t.Errorf("%s -> %s: %v", from, to, err)
				}
				if p, _ := l.current(); p != to {
					t.Errorf("%s -> %s: phase is %s", from, to, p)
				}
				continue
			}
			if !errdefs.IsFailedPrecondition(err) {
				t.Errorf("%s -> %s allowed or wrong error: %v", from, to, err)
			}
			if p, _ := l.current(); p != from {
				t.Errorf("%s -> %s refused but the phase moved to %s", from, to, p)
			}
		}
	}
	// Every phase but Stopped can be stopped; Stopped is terminal.
	for _, p := range all {
		if got := p.canBecome(PhaseStopping); got != (p != PhaseStopping && p != PhaseStopped) {
			t.Errorf("%s -> stopping: %v", p, got)
		}
	}
	if len(transitions[PhaseStopped]) != 0 {
		t.Error("stopped is not terminal")
	}
}

// TestDieAndStop: only a live sandbox dies, once, with its cause; Stop
// wins over a later death, and only the first stop owns the work.
func TestDieAndStop(t *testing.T) {
	l := newLifecycle(PhaseBooting)
	if l.die(errors.New("boom")) {
		t.Error("a booting sandbox died: its start owns the failure")
	}
	_ = l.to(PhaseReady)
	if !l.die(errors.New("qemu killed by signal 9")) {
		t.Fatal("a ready sandbox did not die")
	}
	select {
	case <-l.dead:
		t.Error("dead closed before the VM was buried")
	default:
	}
	l.buried()
	l.buried()
	select {
	case <-l.dead:
	default:
		t.Error("dead not closed")
	}
	if l.die(errors.New("again")) {
		t.Error("died twice")
	}
	err := l.require("exec in container c1", PhaseReady)
	if !errdefs.IsUnavailable(err) || err.Error() != "cannot exec in container c1: the sandbox's VM is gone (qemu killed by signal 9): unavailable" {
		t.Errorf("require on a dead sandbox: %v", err)
	}
	if !l.stop() || l.stop() {
		t.Error("stop: the first call must own the stop, and only it")
	}
	select {
	case <-l.ended:
	default:
		t.Error("ended not closed")
	}
	if l.die(errors.New("late")) {
		t.Error("a stopping sandbox died")
	}

	p := newLifecycle(PhaseReady)
	_ = p.to(PhasePaused)
	if err := p.require("start container c1", PhaseReady); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("require on a paused sandbox: %v", err)
	}
}
