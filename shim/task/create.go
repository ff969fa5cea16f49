package task

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/hooks"
	"github.com/cocoonrt/cocoon/shim/stdio"
)

// Create creates a container in the sandbox; the first one boots the VM.
func (s *Service) Create(ctx context.Context, r *taskapi.CreateTaskRequest) (*taskapi.CreateTaskResponse, error) {
	spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil, err
	}
	// What cannot work in a VM is refused before anything is booted or
	// opened; the sandbox translates the spec again when it creates the
	// container.
	if _, err := oci.GuestSpec(spec, r.ID); err != nil {
		return nil, createRefused(fmt.Errorf("container %s: %w", r.ID, err))
	}
	if err := hooks.Validate(spec.Hooks); err != nil {
		return nil, fmt.Errorf("container %s: %w", r.ID, err)
	}
	if oci.HasTimeNamespace(spec) {
		log.G(ctx).WithField("container", r.ID).Info("the spec's time namespace is left out: the guest's clocks are the VM's own, apart from the host's")
	}
	if err := s.reserve(r.ID); err != nil {
		return nil, err
	}
	clock := startClock(nil)
	create := s.create
	if r.Checkpoint != "" {
		create = s.restore
	}
	p, pio, err := create(ctx, r, spec, &clock)
	if err != nil {
		// A failed first Create does not leave its VM up for nothing.
		if vm := s.unreserve(r.ID); vm != nil {
			if serr := stopVM(context.WithoutCancel(ctx), vm); serr != nil {
				log.G(ctx).WithError(serr).Warn("stop the sandbox of a failed create")
			}
		}
		return nil, err
	}
	pid := s.commitCreate(r, hostHooksOf(r.ID, r.Bundle, spec), p, pio, clock)
	s.unreserve(r.ID)
	return &taskapi.CreateTaskResponse{Pid: pid}, nil
}

// resourcesOf are the limits that size the VM of spec's sandbox: a
// pod's (oci.PodResources) for a pod's sandbox container, else spec's
// linux.resources; nil without them.
func resourcesOf(spec *specs.Spec) (*specs.LinuxResources, error) {
	if oci.IsPodSandbox(spec) {
		return oci.PodResources(spec)
	}
	if spec.Linux == nil {
		return nil, nil
	}
	return spec.Linux.Resources, nil
}

// createRefused turns a "not implemented" refusal into a failed
// precondition, keeping the message. containerd 2.x takes NotImplemented
// from a task v3 Create to mean the shim lacks task v3 and sends the
// Create again over task v2, into stdio its client already closed.
func createRefused(err error) error {
	if !errdefs.IsNotImplemented(err) {
		return err
	}
	return errdefs.ErrFailedPrecondition.WithMessage(err.Error())
}

// reserve claims a container id for a Create in flight.
func (s *Service) reserve(id string) error {
	if id == "" {
		return fmt.Errorf("create: %w: no container id", errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("create container %s: the shim is shutting down: %w", id, errdefs.ErrUnavailable)
	}
	_, exists := s.containers[id]
	_, creating := s.reserved[id]
	if exists || creating {
		return fmt.Errorf("container %s: %w", id, errdefs.ErrAlreadyExists)
	}
	s.reserved[id] = struct{}{}
	return nil
}

// unreserve ends the Create of id. It returns the VM to stop if nothing
// is left in it: the Create failed, and it was the first.
func (s *Service) unreserve(id string) *vmSlot {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.reserved, id)
	return s.releaseVMIfUnusedLocked()
}

// create boots the sandbox if needed and creates the container in the
// guest, with its stdio open. On error nothing is left open.
func (s *Service) create(ctx context.Context, r *taskapi.CreateTaskRequest, spec *specs.Spec, clock *callClock) (_ Process, _ *stdio.IO, retErr error) {
	sbID, _ := SandboxID(r.ID, spec.Annotations)
	hh := hostHooksOf(r.ID, r.Bundle, spec)
	netPath, newNetNS := oci.HostNetwork(spec)
	res, err := resourcesOf(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("container %s: %w", r.ID, err)
	}
	launch := LaunchRequest{
		Namespace: s.ns, ID: sbID, Options: r.Options, Annotations: spec.Annotations,
		NetNS: netPath, NewNetNS: newNetNS, HoldNetNS: hh != nil,
		SpareNICs: lateNICs(spec),
		// A pod's later containers bring volumes, and the VM cannot
		// gain a share once it runs.
		Share:       len(oci.Binds(spec)) > 0 || oci.IsPodSandbox(spec),
		Resources:   res,
		CgroupsPath: oci.PodCgroupsPath(spec),
	}
	// The first container's create hooks run in the boot, before the
	// VM's NICs are made from the namespace they fill.
	hooksRan := false
	if hh != nil {
		launch.BeforeNetwork = func(ctx context.Context, pid int) error {
			hooksRan = true
			return hh.create(ctx, pid)
		}
		launch.UndoNetwork = func(ctx context.Context, pid int) { hh.after(ctx, hooks.Poststop, specs.StateStopped, pid) }
	}
	sb, err := s.sandboxFor(ctx, launch)
	if err != nil {
		return nil, nil, err
	}
	if hh != nil && !hooksRan {
		// The sandbox was up already: the container's hooks run now.
		if err := hh.create(ctx, sb.HookPID()); err != nil {
			hh.after(ctx, hooks.Poststop, specs.StateStopped, sb.HookPID())
			return nil, nil, fmt.Errorf("create container %s: %w", r.ID, err)
		}
	}
	defer func() {
		if retErr != nil {
			hh.after(ctx, hooks.Poststop, specs.StateStopped, sb.HookPID())
		}
	}()
	clock.vm = time.Since(clock.began)
	clock.guestFrom(sb)
	pio, err := stdio.Open(ctx, s.ns, r.ID, stdio.Config{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal})
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if retErr != nil {
			_ = pio.Close(context.WithoutCancel(ctx))
		}
	}()
	p, err := sb.CreateContainer(ctx, ContainerSpec{
		ID:     r.ID,
		Spec:   spec,
		Rootfs: rootfsMounts(r.Bundle, r.Rootfs, spec),
		Stdin:  pio.Stdin(),
		Stdout: pio.Stdout(),
		Stderr: pio.Stderr(),
	})
	if err != nil {
		return nil, nil, createRefused(fmt.Errorf("create container %s: %w", r.ID, err))
	}
	return p, pio, nil
}

// lateInterfaces is how many interfaces a client that fills the
// namespace after Create (oci.LateNetwork) gets into the VM: Docker
// connects a container to one network at its start (more come with
// `docker network connect`, which a running VM cannot take). Each spare
// takes one of microvm's few virtio-mmio transports.
const lateInterfaces = 1

// lateNICs is how many spare NICs the VM of spec's sandbox gets, for
// interfaces that its client adds after Create.
func lateNICs(spec *specs.Spec) int {
	if oci.LateNetwork(spec) {
		return lateInterfaces
	}
	return 0
}

// commitCreate records the created container, publishes its create event
// and starts waiting for its init; it returns the pid for containerd.
func (s *Service) commitCreate(r *taskapi.CreateTaskRequest, hh *hostHooks, guest Process, pio *stdio.IO, clock callClock) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := newProcess(r.ID, "", stdio.Config{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal}, nil)
	p.guest, p.io = guest, pio
	c := &container{id: r.ID, bundle: filepath.Clean(r.Bundle), hooks: hh, init: p, execs: make(map[string]*process)}
	clock.addLocked(c)
	s.containers[r.ID] = c
	pid := s.hostPIDLocked()
	s.publish(TopicCreate, &eventstypes.TaskCreate{
		ContainerID: r.ID,
		Bundle:      r.Bundle,
		Rootfs:      r.Rootfs,
		IO:          &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		Checkpoint:  r.Checkpoint,
		Pid:         pid,
	})
	go s.waitExit(c, p, guest, pio)
	return pid
}
