package task

import (
	"context"
	"fmt"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/emptypb"
)

// State reports a process's state.
func (s *Service) State(ctx context.Context, r *taskapi.StateRequest) (*taskapi.StateResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.findLocked(r.ID, r.ExecID, "")
	if err != nil {
		return nil, err
	}
	p := t.p
	id := p.execID
	if id == "" {
		id = p.containerID
	}
	return &taskapi.StateResponse{
		ID:         id,
		Bundle:     t.c.bundle,
		Pid:        t.pid,
		Status:     p.state.status(),
		Stdin:      p.stdio.Stdin,
		Stdout:     p.stdio.Stdout,
		Stderr:     p.stdio.Stderr,
		Terminal:   p.stdio.Terminal,
		ExitStatus: p.exit.code,
		ExitedAt:   timestamp(p.exit.at),
		ExecID:     p.execID,
	}, nil
}

// Wait returns once a process has exited and its exit was published.
func (s *Service) Wait(ctx context.Context, r *taskapi.WaitRequest) (*taskapi.WaitResponse, error) {
	t, err := s.find(r.ID, r.ExecID, "")
	if err != nil {
		return nil, err
	}
	select {
	case <-t.p.exited:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for %s: %w", t.p.name(), ctx.Err())
	}
	// exit was written before exited was closed.
	return &taskapi.WaitResponse{ExitStatus: t.p.exit.code, ExitedAt: timestamp(t.p.exit.at)}, nil
}

// Pids lists a container's processes as the guest sees them (guest
// pids), except the container's init, which is listed under the task's
// pid (the VMM's host pid, which State and Create give), so that the
// task's pid is among them as under runc. An exec's entry carries its exec
// id, as runc's shim gives it (runc's ProcessDetails, which ctr decodes).
// docs/containerd.md says what each pid means.
func (s *Service) Pids(ctx context.Context, r *taskapi.PidsRequest) (*taskapi.PidsResponse, error) {
	t, err := s.find(r.ID, "", "")
	if err != nil {
		return nil, err
	}
	sb, err := t.sandbox()
	if err != nil {
		return nil, err
	}
	pids, err := sb.ContainerPids(ctx, r.ID)
	if err != nil {
		return nil, fmt.Errorf("list the processes of container %s: %w", r.ID, err)
	}
	initPid, execs := s.guestPids(t.c)
	out := make([]*tasktypes.ProcessInfo, 0, len(pids))
	for _, pid := range pids {
		info := &tasktypes.ProcessInfo{Pid: pid}
		if execID, ok := execs[pid]; ok {
			d, err := typeurl.MarshalAnyToProto(&runcoptions.ProcessDetails{ExecID: execID})
			if err != nil {
				return nil, fmt.Errorf("list the processes of container %s: %w", r.ID, err)
			}
			info.Info = d
		} else if pid == initPid && t.pid != 0 {
			info.Pid = t.pid
		}
		out = append(out, info)
	}
	return &taskapi.PidsResponse{Processes: out}, nil
}

// guestPids returns the guest pids of c's init and of its execs (by pid)
// that have started and not exited; 0 for an init that has not. It takes
// s.mu.
func (s *Service) guestPids(c *container) (initPid uint32, execs map[uint32]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	live := func(p *process) bool {
		return p.guest != nil && (p.state == stateStarting || p.state == stateRunning || p.state == statePaused)
	}
	if live(c.init) {
		initPid = c.init.guest.Pid()
	}
	execs = make(map[uint32]string, len(c.execs))
	for id, e := range c.execs {
		if live(e) {
			execs[e.guest.Pid()] = id
		}
	}
	return initPid, execs
}

// Stats returns a container's cgroup v2 metrics
// (io.containerd.cgroups.v2.Metrics, as containerd expects on Linux).
func (s *Service) Stats(ctx context.Context, r *taskapi.StatsRequest) (*taskapi.StatsResponse, error) {
	sb, err := s.containerSandbox(r.ID)
	if err != nil {
		return nil, err
	}
	m, err := sb.ContainerStats(ctx, r.ID)
	if err != nil {
		return nil, fmt.Errorf("stats of container %s: %w", r.ID, err)
	}
	a, err := typeurl.MarshalAnyToProto(m)
	if err != nil {
		return nil, fmt.Errorf("stats of container %s: %w", r.ID, err)
	}
	return &taskapi.StatsResponse{Stats: a}, nil
}

// containerSandbox is the running sandbox of container id, for queries
// answered by the guest.
func (s *Service) containerSandbox(id string) (Sandbox, error) {
	t, err := s.find(id, "", "")
	if err != nil {
		return nil, err
	}
	return t.sandbox()
}

// Connect tells containerd this shim's pid and the container's.
func (s *Service) Connect(ctx context.Context, r *taskapi.ConnectRequest) (*taskapi.ConnectResponse, error) {
	t, err := s.find(r.ID, "", "")
	if err != nil {
		return nil, err
	}
	return &taskapi.ConnectResponse{ShimPid: shimPID(), TaskPid: t.pid}, nil
}

// Shutdown ends the shim once it serves no container; while it does, the
// call is a no-op (containerd calls it after every Delete).
func (s *Service) Shutdown(ctx context.Context, r *taskapi.ShutdownRequest) (*emptypb.Empty, error) {
	s.mu.Lock()
	busy := len(s.containers) > 0 || len(s.reserved) > 0
	s.mu.Unlock()
	if !busy && s.shutdown != nil {
		s.shutdown()
	}
	return &emptypb.Empty{}, nil
}
