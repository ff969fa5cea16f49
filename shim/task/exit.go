package task

import (
	"context"
	"syscall"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/shim/stdio"
)

// waitExit waits for a process to end, flushes its output and records the
// exit. An init's exit is recorded after those of its execs.
func (s *Service) waitExit(c *container, p *process, guest Process, pio *stdio.IO) {
	lg := logger(s.ctx, p.containerID, p.execID)
	st, err := guest.Wait(s.ctx)
	exit := exitStatus{code: st.Code, at: st.ExitedAt, oomKills: st.OOMKills}
	if err != nil {
		exit = s.lostExit(lg, err)
	}
	if exit.at.IsZero() {
		exit.at = time.Now()
	}
	// Wait returned after the output reached our writers; closing them
	// is what lets the client's readers see the end.
	if pio != nil {
		if err := pio.CloseOutput(); err != nil {
			lg.WithError(err).Warn("close output")
		}
	}
	if p.execID == "" {
		s.waitExecs(c)
	}
	lg.WithField("exit_status", exit.code).Debug("process exited")
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.state == stateStarting {
		// Start publishes its event first, then this exit.
		p.earlyExit = &exit
		return
	}
	s.recordExitLocked(p, exit)
}

// killedWithVM is the exit status of a process whose sandbox's VM died
// under it: it was killed with the VM, as if by SIGKILL (128 + 9).
const killedWithVM = 137

// deathGrace is how long a process whose wait failed waits to learn that
// its sandbox died: the VM's end and the wait's failure are one event
// seen from two goroutines.
const deathGrace = 3 * time.Second

// lostExit is the exit of a process whose wait failed: killedWithVM if
// the sandbox died, else unknownExit.
func (s *Service) lostExit(lg *log.Entry, err error) exitStatus {
	s.mu.Lock()
	var sb Sandbox
	if s.vm != nil {
		sb = s.vm.sb
	}
	s.mu.Unlock()
	if sb != nil {
		t := time.NewTimer(deathGrace)
		defer t.Stop()
		select {
		case <-sb.Dead():
			lg.WithError(err).Warn("the sandbox's VM died: reporting the process killed")
			return exitStatus{code: killedWithVM, at: time.Now()}
		case <-t.C:
		case <-s.ctx.Done():
		}
	}
	lg.WithError(err).Warn("lost the process: reporting an unknown exit")
	return exitStatus{code: unknownExit}
}

// waitExecs makes sure a container's execs have ended once its init has:
// they are killed (they outlive the init only when they share a pid
// namespace with something else) and waited for, within the grace period.
func (s *Service) waitExecs(c *container) {
	s.mu.Lock()
	var running []*process
	for _, e := range c.execs {
		switch e.state {
		case stateStarting, stateRunning, statePaused:
			running = append(running, e)
		}
	}
	var sb Sandbox
	if s.vm != nil {
		sb = s.vm.sb
	}
	s.mu.Unlock()
	if len(running) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.execGrace)
	defer cancel()
	if sb != nil {
		if err := sb.KillContainer(ctx, c.id, syscall.SIGKILL, true); err != nil {
			log.G(ctx).WithError(err).WithField("container", c.id).Debug("kill the execs of an exited container")
		}
	}
	// An exec that was starting may fail to start instead (the init's
	// end took its container with it): it goes back to created and never
	// exits, so its state is looked at too.
	tick := time.NewTicker(execSettlePoll)
	defer tick.Stop()
	for _, e := range running {
		for settled := false; !settled; {
			select {
			case <-e.exited:
				settled = true
			case <-tick.C:
				s.mu.Lock()
				settled = e.state == stateCreated
				s.mu.Unlock()
			case <-ctx.Done():
				s.mu.Lock()
				st := e.state
				s.mu.Unlock()
				log.G(ctx).WithFields(log.Fields{"container": c.id, "exec": e.execID, "state": st}).
					Warn("execs still running after the container's init exited; publishing its exit anyway")
				return
			}
		}
	}
}

// execSettlePoll is how often waitExecs looks at the state of an exec
// that has not exited.
const execSettlePoll = 50 * time.Millisecond

// recordExitLocked marks p stopped and publishes its exit, unless it is
// already stopped or deleted. An init's exit is preceded by the OOM kill
// it carries, if the guest's event for it has not come yet. Callers hold
// s.mu.
func (s *Service) recordExitLocked(p *process, exit exitStatus) {
	p.earlyExit = nil
	if p.state.check(opExit, p.name()) != nil {
		return
	}
	p.state = stateStopped
	p.exit = exit
	if c := s.containers[p.containerID]; c != nil && p.execID == "" && exit.oomKills > 0 {
		s.publishOOMLocked(c, exit.oomKills)
	}
	s.publish(TopicExit, exitEvent(p, s.hostPIDLocked()))
	close(p.exited)
}
