package task

import (
	"context"
	"fmt"
	"syscall"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Kill signals a container's init (with all: every process in the
// container), or an exec.
func (s *Service) Kill(ctx context.Context, r *taskapi.KillRequest) (*emptypb.Empty, error) {
	if r.Signal == 0 || r.Signal > maxSignal {
		return nil, fmt.Errorf("signal %d: %w", r.Signal, errdefs.ErrInvalidArgument)
	}
	t, err := s.find(r.ID, r.ExecID, opKill)
	if err != nil {
		return nil, err
	}
	if err := signal(ctx, t, syscall.Signal(r.Signal), r.All); err != nil {
		return nil, fmt.Errorf("signal %s with %v: %w", t.p.name(), syscall.Signal(r.Signal), err)
	}
	if r.Signal == uint32(syscall.SIGKILL) {
		go s.releaseOutput(t, r.All)
	}
	return &emptypb.Empty{}, nil
}

// outputGrace is how long a SIGKILLed process's output may stay blocked
// on a client that stopped reading (ctr killed, `ctr task delete -f`)
// before the shim drops its own read side of the fifos; runc's shim bounds
// its wait for output at delete the same way.
const outputGrace = 2 * time.Second

// releaseOutput waits for a killed process (with all: and its container's
// execs) to exit; if one has not within outputGrace, its output is what
// holds it back (a process killed by SIGKILL is gone at once), so the
// shim stops keeping its fifos open for a client that is not reading.
func (s *Service) releaseOutput(t target, all bool) {
	procs := []*process{t.p}
	if all && t.p.execID == "" {
		s.mu.Lock()
		for _, e := range t.c.execs {
			procs = append(procs, e)
		}
		s.mu.Unlock()
	}
	timer := time.NewTimer(outputGrace)
	defer timer.Stop()
	for _, p := range procs {
		select {
		case <-p.exited:
			continue
		case <-timer.C:
		}
		s.mu.Lock()
		pio := p.io
		s.mu.Unlock()
		if pio != nil {
			logger(s.ctx, p.containerID, p.execID).Warn("output not read 2s after SIGKILL: no longer holding the fifos open")
			pio.DropReaders()
		}
		// The grace has passed for every process left.
		timer.Reset(0)
	}
}

// maxSignal is the highest Linux signal number (SIGRTMAX).
const maxSignal = 64

// signal signals an init through the sandbox (runc kill in the guest,
// which knows --all) or an exec's guest process.
func signal(ctx context.Context, t target, sig syscall.Signal, all bool) error {
	if t.p.execID == "" {
		return t.sb.KillContainer(ctx, t.c.id, sig, all)
	}
	guest, err := t.started(opKill)
	if err != nil {
		return err
	}
	return guest.Signal(ctx, sig, false)
}
