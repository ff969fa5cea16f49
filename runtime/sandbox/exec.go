package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/agent"
)

// undoPace paces the undo of an exec whose start is still in flight in
// the guest.
const undoPace = 50 * time.Millisecond

// undoNotFoundTries is how many times the undo of an exec asks again for
// a process the guest does not know: the exec request may still be on its
// way, ahead of the undo on the same session.
const undoNotFoundTries = 3

// ExecProcess runs p in the container; execID is containerd's exec id.
// The process's stdio is wired as in CreateContainer.
func (s *Sandbox) ExecProcess(ctx context.Context, containerID, execID string, p *specs.Process, stdin io.Reader, stdout, stderr io.Writer) (*agent.Process, error) {
	ct, leave, err := s.enter(containerID, "exec in")
	if err != nil {
		return nil, err
	}
	defer leave()
	if p := s.containers.userOf(ct); p != nil {
		// The exec sees the user a retry under way is making.
		p.wait(ctx)
	}
	gp, err := oci.GuestProcess(p)
	if err != nil {
		return nil, fmt.Errorf("exec %s in container %s: %w", execID, containerID, err)
	}
	data, err := json.Marshal(gp)
	if err != nil {
		return nil, err
	}
	if gp.Terminal {
		stderr = nil
	}
	pid := s.containers.processID()
	proc, err := s.agent.ExecProcess(ctx, agent.ExecCreate{
		ContainerID: ct.guest,
		ProcessID:   pid,
		Process:     data,
		Stdin:       stdin,
		Stdout:      stdout,
		Stderr:      stderr,
	})
	if err != nil {
		if !errdefs.IsUnavailable(err) && !s.dead() {
			// The guest may have started the process after the call
			// gave up on its answer: it must not be left running.
			s.undoExec(context.WithoutCancel(ctx), pid)
		}
		return nil, err
	}
	log.G(ctx).WithField("container", containerID).WithField("exec", execID).WithField("process", proc.ID()).Debug("exec started")
	return proc, nil
}

// undoExec kills and reaps guest process id, whose exec call failed on
// the host's side (a deadline, a cancelled request) while the guest may
// still have started it. The guest knows the process as "starting" until
// its exec ends: the undo asks again until it is started (then kills and
// waits for it) or unknown (it failed, or never came), bounded by
// guestUndoTimeout.
func (s *Sandbox) undoExec(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, guestUndoTimeout)
	defer cancel()
	lg := log.G(ctx).WithField("process", id)
	notFound := 0
	for {
		err := s.agent.SignalProcess(ctx, id, syscall.SIGKILL)
		switch {
		case err == nil:
			if _, err := s.agent.WaitProcess(ctx, id); err != nil && !errdefs.IsNotFound(err) {
				lg.WithError(err).Warn("undo exec: reap the process")
			} else {
				lg.Info("undo exec: the process the guest started after its exec failed was killed")
			}
			return
		case errdefs.IsNotFound(err):
			if notFound++; notFound >= undoNotFoundTries {
				return
			}
		case errdefs.IsFailedPrecondition(err):
			// Still starting.
		default:
			lg.WithError(err).Warn("undo exec: kill the process")
			return
		}
		t := time.NewTimer(undoPace)
		select {
		case <-ctx.Done():
			t.Stop()
			lg.Warn("undo exec: gave up; the process may still run in the guest until its container ends")
			return
		case <-t.C:
		}
	}
}
