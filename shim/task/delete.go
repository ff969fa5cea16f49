package task

import (
	"context"
	"fmt"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/log"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/runtime/hooks"
)

// Delete removes a stopped (or never started) process. Deleting a
// container's init removes the container from the guest; deleting the
// sandbox's last container stops the VM.
func (s *Service) Delete(ctx context.Context, r *taskapi.DeleteRequest) (*taskapi.DeleteResponse, error) {
	t, err := s.find(r.ID, r.ExecID, opDelete)
	if err != nil {
		return nil, err
	}
	clock := startClock(t.sb)
	exit, vm, last, err := s.commitLastDelete(ctx, t)
	if err != nil {
		return nil, err
	}
	if !last {
		if r.ExecID == "" {
			if err := s.deleteContainer(ctx, t); err != nil {
				return nil, err
			}
		}
		if exit, vm, err = s.commitDelete(t); err != nil {
			return nil, err
		}
	}
	// A copy back of the writable layer, before this, counts as guest
	// time: the guest syncs, reads and sends it while the shim applies it.
	clock.vm = s.release(ctx, t, vm)
	if r.ExecID == "" {
		s.mu.Lock()
		clock.addLocked(t.c)
		tm := t.c.timing
		s.mu.Unlock()
		logTiming(ctx, t.c, tm)
	}
	return &taskapi.DeleteResponse{Pid: t.pid, ExitStatus: exit.code, ExitedAt: timestamp(exit.at)}, nil
}

// commitLastDelete commits the delete of the sandbox's last container at
// once, when its processes have all exited and no other container is
// being created: the VM it returns is stopped next, and the container,
// its disks and anything left in the guest go with it. Only the
// container's writable layer is taken back to the host first
// (FlushContainer: the guest streams it, the shim applies it). Removing
// the container from the guest (the runtime's delete, unmounts and disk
// unplugs) would take a third of a second under TCG for a guest that is
// about to end. last is false, and nothing is done but the copy back, in
// every other case.
func (s *Service) commitLastDelete(ctx context.Context, t target) (exitStatus, *vmSlot, bool, error) {
	if t.p.execID != "" || t.sb == nil {
		return exitStatus{}, nil, false, nil
	}
	s.mu.Lock()
	last := s.lastLocked(t)
	s.mu.Unlock()
	if !last {
		return exitStatus{}, nil, false, nil
	}
	if err := t.sb.FlushContainer(ctx, t.c.id); err != nil {
		// The full delete then says what is wrong, or copes.
		logger(ctx, t.c.id, "").WithError(err).Warn("flush the container before its VM stops")
		return exitStatus{}, nil, false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.lastLocked(t) {
		return exitStatus{}, nil, false, nil
	}
	exit, vm, err := s.commitDeleteLocked(t)
	return exit, vm, true, err
}

// lastLocked reports whether t's container is the sandbox's last, with
// all its processes exited and no other container being created. Callers
// hold s.mu.
func (s *Service) lastLocked(t target) bool {
	if len(s.containers) != 1 || len(s.reserved) != 0 || t.p.state != stateStopped {
		return false
	}
	for _, e := range t.c.execs {
		if e.state != stateStopped {
			return false
		}
	}
	return true
}

// deleteContainer removes the container from the guest. One that never
// ran is killed by that: its exit is waited for, so that it is reported
// before the delete.
func (s *Service) deleteContainer(ctx context.Context, t target) error {
	if err := t.sb.DeleteContainer(ctx, t.c.id); err != nil {
		return fmt.Errorf("delete container %s: %w", t.c.id, err)
	}
	select {
	case <-t.p.exited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for container %s to exit: %w", t.c.id, ctx.Err())
	}
}

// commitDelete marks the process deleted, drops it and publishes the
// delete event of a container. It returns the VM to stop if that was the
// sandbox's last container.
func (s *Service) commitDelete(t target) (exitStatus, *vmSlot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commitDeleteLocked(t)
}

// commitDeleteLocked is commitDelete with s.mu held.
func (s *Service) commitDeleteLocked(t target) (exitStatus, *vmSlot, error) {
	p := t.p
	if err := p.state.check(opDelete, p.name()); err != nil {
		return exitStatus{}, nil, err // lost a race with another Delete
	}
	p.state = stateDeleted
	if p.execID != "" {
		delete(t.c.execs, p.execID)
		return p.exit, nil, nil
	}
	delete(s.containers, t.c.id)
	s.publish(TopicDelete, &eventstypes.TaskDelete{
		ContainerID: t.c.id,
		ID:          t.c.id,
		Pid:         t.pid,
		ExitStatus:  p.exit.code,
		ExitedAt:    timestamp(p.exit.at),
	})
	return p.exit, s.releaseVMIfUnusedLocked(), nil
}

// release closes the deleted process's stdio (and a container's execs'),
// and stops the VM if nothing is left in it; it returns how long the stop
// took.
func (s *Service) release(ctx context.Context, t target, vm *vmSlot) time.Duration {
	procs := []*process{t.p}
	if t.p.execID == "" {
		s.mu.Lock()
		for _, e := range t.c.execs {
			procs = append(procs, e)
		}
		s.mu.Unlock()
	}
	for _, p := range procs {
		s.mu.Lock()
		pio := p.io
		s.mu.Unlock()
		if pio != nil {
			if err := pio.Close(ctx); err != nil {
				logger(ctx, p.containerID, p.execID).WithError(err).Warn("close stdio")
			}
		}
	}
	if t.p.execID == "" && t.sb != nil {
		// After the container, before the VM and the namespace holder.
		t.c.hooks.after(ctx, hooks.Poststop, specs.StateStopped, t.sb.HookPID())
	}
	began := time.Now()
	if err := stopVM(ctx, vm); err != nil {
		log.G(ctx).WithError(err).Warn("stop the sandbox after its last container")
	}
	if vm == nil {
		return 0
	}
	return time.Since(began)
}
