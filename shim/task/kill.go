package task

import (
	"context"
	"fmt"
	"syscall"

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
	return &emptypb.Empty{}, nil
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
