package task

import (
	"context"
	"fmt"

	eventstypes "github.com/containerd/containerd/api/events"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/runtime/hooks"
	"github.com/cocoonrt/cocoon/shim/stdio"
)

// Start starts a created container's init, or an exec declared by Exec.
func (s *Service) Start(ctx context.Context, r *taskapi.StartRequest) (*taskapi.StartResponse, error) {
	t, err := s.beginStart(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	clock := startClock(t.sb)
	guest, pio, err := s.startInGuest(ctx, t)
	pid, err := s.commitStart(ctx, t.c, t.p, guest, pio, err)
	if err != nil {
		return nil, err
	}
	if r.ExecID == "" {
		t.c.hooks.after(ctx, hooks.Poststart, specs.StateRunning, t.sb.HookPID())
		s.mu.Lock()
		clock.addLocked(t.c)
		s.mu.Unlock()
	}
	return &taskapi.StartResponse{Pid: pid}, nil
}

// startInGuest starts a container's init (created with the container), or
// starts an exec, which returns its new guest process and stdio.
func (s *Service) startInGuest(ctx context.Context, t target) (Process, *stdio.IO, error) {
	if t.p.execID == "" {
		if err := t.sb.StartContainer(ctx, t.c.id); err != nil {
			return nil, nil, fmt.Errorf("start %s: %w", t.p.name(), err)
		}
		return nil, nil, nil
	}
	return s.startExec(ctx, t.sb, t.p)
}

// beginStart checks that the process may start and marks it starting. An
// exec starts only in a running container.
func (s *Service) beginStart(id, execID string) (target, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.findLocked(id, execID, opStart)
	if err != nil {
		return target{}, err
	}
	if execID != "" {
		if st := t.c.init.state; st != stateRunning {
			return target{}, fmt.Errorf("cannot start %s: the container is %s: %w", t.p.name(), st, errdefs.ErrFailedPrecondition)
		}
	}
	t.p.state = stateStarting
	return t, nil
}

// startExec opens an exec's stdio and starts it in the guest.
func (s *Service) startExec(ctx context.Context, sb Sandbox, p *process) (Process, *stdio.IO, error) {
	pio, err := stdio.Open(ctx, s.ns, p.execID, p.stdio)
	if err != nil {
		return nil, nil, err
	}
	guest, err := sb.ExecProcess(ctx, p.containerID, p.execID, p.spec, pio.Stdin(), pio.Stdout(), pio.Stderr())
	if err != nil {
		_ = pio.Close(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("start %s: %w", p.name(), err)
	}
	return guest, pio, nil
}

// commitStart records the outcome of a start. On success it publishes the
// start event, then an exit that arrived meanwhile; an exec's exit is
// waited for from here on (an init's since Create).
func (s *Service) commitStart(ctx context.Context, c *container, p *process, guest Process, pio *stdio.IO, startErr error) (uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if startErr != nil {
		if p.state == stateStarting {
			p.state = stateCreated
		}
		if p.earlyExit != nil {
			s.recordExitLocked(p, *p.earlyExit)
		}
		return 0, startErr
	}
	pid := s.hostPIDLocked()
	p.state = stateRunning
	if p.execID == "" {
		s.publish(TopicStart, &eventstypes.TaskStart{ContainerID: p.containerID, Pid: pid})
	} else {
		p.guest, p.io = guest, pio
		s.publish(TopicExecStarted, &eventstypes.TaskExecStarted{ContainerID: p.containerID, ExecID: p.execID, Pid: pid})
		go s.waitExit(c, p, guest, pio)
	}
	if p.earlyExit != nil {
		s.recordExitLocked(p, *p.earlyExit)
	}
	logger(ctx, p.containerID, p.execID).WithField("guest_pid", p.guest.Pid()).Debug("process started")
	return pid, nil
}
