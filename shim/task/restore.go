package task

import (
	"context"
	"fmt"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/shim/stdio"
)

// restore is create for a task whose Create names a checkpoint
// (ctr container restore --live, CRI's restore): the sandbox's VM is
// brought back from the checkpoint instead of booted, with the
// checkpoint's container as r.ID, its processes running on from where
// they were, frozen until Start. A checkpoint captures a whole VM, so it
// is only restored as a sandbox of its own.
func (s *Service) restore(ctx context.Context, r *taskapi.CreateTaskRequest, spec *specs.Spec, clock *callClock) (_ Process, _ *stdio.IO, retErr error) {
	sbID, joins := SandboxID(r.ID, spec.Annotations)
	if joins {
		return nil, nil, fmt.Errorf("restore container %s: it would join the running sandbox %s, and a checkpoint restores a whole VM: %w", r.ID, sbID, errdefs.ErrFailedPrecondition)
	}
	if oci.HasHostHooks(spec.Hooks) {
		// They made what the container had on the host (nerdctl's and
		// Docker's network), which a restore would have to make again.
		return nil, nil, fmt.Errorf("restore container %s: its spec has OCI hooks that run on the host, and a restore does not run them: %w", r.ID, errdefs.ErrFailedPrecondition)
	}
	pio, err := stdio.Open(ctx, s.ns, r.ID, stdio.Config{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal})
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if retErr != nil {
			_ = pio.Close(context.WithoutCancel(ctx))
		}
	}()
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return nil, nil, fmt.Errorf("restore container %s: the shim is shutting down: %w", r.ID, errdefs.ErrUnavailable)
	case s.vm != nil:
		id := s.vm.id
		s.mu.Unlock()
		return nil, nil, fmt.Errorf("restore container %s: this shim already serves sandbox %s, and a checkpoint restores a whole VM: %w", r.ID, id, errdefs.ErrFailedPrecondition)
	}
	slot := &vmSlot{id: sbID, ready: make(chan struct{})}
	s.vm = slot
	s.mu.Unlock()

	var init Process
	s.boot(ctx, slot, func(ctx context.Context) (Sandbox, error) {
		res, err := resourcesOf(spec)
		if err != nil {
			return nil, err
		}
		sb, p, err := s.launcher.Restore(ctx, LaunchRequest{Namespace: s.ns, ID: sbID, Options: r.Options, Annotations: spec.Annotations, NetNS: oci.NetworkNamespace(spec), Resources: res}, r.Checkpoint, ContainerSpec{
			ID:     r.ID,
			Spec:   spec,
			Rootfs: rootfsMounts(r.Bundle, r.Rootfs, spec),
			Stdin:  pio.Stdin(),
			Stdout: pio.Stdout(),
			Stderr: pio.Stderr(),
		})
		init = p
		return sb, err
	})
	clock.vm = time.Since(clock.began)
	if slot.err != nil {
		return nil, nil, createRefused(fmt.Errorf("restore container %s: %w", r.ID, slot.err))
	}
	clock.guestFrom(slot.sb)
	return init, pio, nil
}
