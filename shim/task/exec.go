package task

import (
	"context"
	"fmt"

	eventstypes "github.com/containerd/containerd/api/events"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonrt/cocoon/shim/stdio"
)

// Exec declares another process of a running container; Start runs it.
func (s *Service) Exec(ctx context.Context, r *taskapi.ExecProcessRequest) (*emptypb.Empty, error) {
	var spec specs.Process
	if err := decodeJSONAny(r.Spec, processSpecURL, &spec); err != nil {
		return nil, fmt.Errorf("exec %s: process spec: %w", r.ExecID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.addExecLocked(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	cfg := stdio.Config{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal}
	c.execs[r.ExecID] = newProcess(r.ID, r.ExecID, cfg, &spec)
	s.publish(TopicExecAdded, &eventstypes.TaskExecAdded{ContainerID: r.ID, ExecID: r.ExecID})
	return &emptypb.Empty{}, nil
}

// addExecLocked checks that container id can take an exec named execID.
// Callers hold s.mu.
func (s *Service) addExecLocked(id, execID string) (*container, error) {
	if execID == "" {
		return nil, fmt.Errorf("exec in container %s: %w: no exec id", id, errdefs.ErrInvalidArgument)
	}
	t, err := s.findLocked(id, "", opExec)
	if err != nil {
		return nil, err
	}
	if _, ok := t.c.execs[execID]; ok {
		return nil, fmt.Errorf("exec %s of container %s: %w", execID, id, errdefs.ErrAlreadyExists)
	}
	return t.c, nil
}

// ResizePty sets the terminal size of a process.
func (s *Service) ResizePty(ctx context.Context, r *taskapi.ResizePtyRequest) (*emptypb.Empty, error) {
	t, err := s.find(r.ID, r.ExecID, opResize)
	if err != nil {
		return nil, err
	}
	guest, err := t.started(opResize)
	if err != nil {
		return nil, err
	}
	if err := guest.Resize(ctx, r.Width, r.Height); err != nil {
		return nil, fmt.Errorf("resize the terminal of %s: %w", t.p.name(), err)
	}
	return &emptypb.Empty{}, nil
}

// CloseIO closes a process's stdin: it reads EOF once what the client
// wrote has been delivered. As with runc's shim, a process that has exited
// takes it until it is deleted (containerd's client calls it once its copy
// of stdin ends, however soon the process did): its stdin went with it,
// so only the shim's side is closed.
func (s *Service) CloseIO(ctx context.Context, r *taskapi.CloseIORequest) (*emptypb.Empty, error) {
	t, exited, err := s.findStdin(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if r.Stdin && t.guest != nil && !exited {
		if err := t.guest.CloseStdin(ctx); err != nil {
			return nil, fmt.Errorf("close the stdin of %s: %w", t.p.name(), err)
		}
	}
	if r.Stdin && t.io != nil {
		// The guest has all the input: release a read that waits for more.
		_ = t.io.CloseStdin()
	}
	return &emptypb.Empty{}, nil
}

// findStdin looks up the process whose stdin CloseIO closes, and says
// whether it has exited, in which case the VM need not be running.
func (s *Service) findStdin(id, execID string) (target, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.findLocked(id, execID, "")
	if err != nil {
		return target{}, false, err
	}
	if t.p.state == stateStopped {
		return t, true, nil
	}
	t, err = s.findLocked(id, execID, opCloseIO)
	return t, false, err
}
