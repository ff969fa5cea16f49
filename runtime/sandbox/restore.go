package sandbox

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/agent"
	"github.com/cocoonrt/cocoon/runtime/checkpoint"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/rootfs"
)

// maxRestoredScratch bounds the nominal size of a scratch disk a
// checkpoint may ask for (the file is sparse; this bounds a manifest
// that lies).
const maxRestoredScratch = 1 << 40

// RestoreOptions say which checkpoint Restore brings back, and as what.
type RestoreOptions struct {
	// Dir is the checkpoint directory (containerd's extraction of the
	// checkpoint image).
	Dir string
	// AllowOtherNamespace lets a checkpoint made in another containerd
	// namespace be restored (annotation
	// io.cocoon.checkpoint.allow-other-namespace); otherwise that is
	// refused as a permission error.
	AllowOtherNamespace bool
	// Container is the container the checkpoint's container becomes:
	// its id (which may differ from the saved one), its spec, the
	// rootfs containerd prepared from the checkpoint's image, and the
	// new task's stdio.
	Container ContainerSpec
}

// Restore brings back a sandbox saved by Checkpoint: the checkpoint is
// verified (files, digests, guest image, machine, namespace), the
// container's layers are prepared from its rootfs mounts and checked
// against the digests the checkpoint recorded (a layer the cache lost is
// rebuilt to the same bytes), its scratch disk is written back, and the
// VM is launched from the saved state instead of booting. Once the agent
// answers, the guest gets the host's clock, fresh entropy (reseeded) and
// its hostname, its filesystems are thawed, and the container's init is
// attached to the new stdio. The container's processes stay frozen until
// StartContainer.
//
// It returns the sandbox and the container's init. On error nothing is
// left running and nothing of the sandbox is left on the host.
func Restore(ctx context.Context, o Options, ro RestoreOptions) (*Sandbox, *agent.Process, error) {
	r := &restoring{opts: ro}
	sb, err := start(ctx, o, r)
	if err != nil {
		// The checkpoint's own refusals name its directory already.
		if strings.Contains(err.Error(), ro.Dir) {
			return nil, nil, fmt.Errorf("restore: %w", err)
		}
		return nil, nil, fmt.Errorf("restore from checkpoint %s: %w", ro.Dir, err)
	}
	if err := sb.provisionRestored(ctx, r.ct, ro.Container); err != nil {
		if serr := sb.Stop(context.WithoutCancel(ctx)); serr != nil {
			log.G(ctx).WithError(serr).Warn("stop the sandbox of a failed restore")
		}
		return nil, nil, fmt.Errorf("restore from checkpoint %s: %w", ro.Dir, err)
	}
	return sb, r.init, nil
}

// restoring is a restore in progress; start calls verify, prepare and
// reattach.
type restoring struct {
	opts RestoreOptions
	m    *checkpoint.Manifest
	// saved is the checkpoint's container, and proc its init.
	saved checkpoint.Container
	proc  checkpoint.Process
	// ct is the container being brought back; init its init, once
	// attached.
	ct   *container
	init *agent.Process
	// stateChecked delivers the verification of the VM state file,
	// which runs while the restore prepares (see verify).
	stateChecked chan error
	// took is what each step took, for the log.
	took struct{ verify, prepare, launch, connect, reattach time.Duration }
}

// verify checks the checkpoint against the sandbox about to be launched.
func (r *restoring) verify(s *Sandbox) error {
	c := r.opts.Container
	if err := ValidName("container id", c.ID); err != nil {
		return err
	}
	if c.Spec == nil {
		return fmt.Errorf("container %s: no spec: %w", c.ID, errdefs.ErrInvalidArgument)
	}
	if _, err := oci.GuestSpec(c.Spec, c.ID); err != nil {
		return fmt.Errorf("container %s: %w", c.ID, err)
	}
	if s.rootfs == nil {
		return fmt.Errorf("container %s: the sandbox was started without a layer cache: %w", c.ID, errdefs.ErrFailedPrecondition)
	}
	// Every file but the VM state is verified now, before anything is
	// made. The state, the largest by far, is hashed while the disks are
	// prepared and QEMU starts; the driver is handed it only once it
	// passed (prepare's Check).
	m, err := checkpoint.ReadManifest(r.opts.Dir)
	if err != nil {
		return err
	}
	for _, f := range m.Files {
		if f.Name == m.State {
			continue
		}
		if err := checkpoint.VerifyFile(r.opts.Dir, m, f.Name); err != nil {
			return err
		}
	}
	if err := m.CheckNamespace(s.Namespace, r.opts.AllowOtherNamespace); err != nil {
		return err
	}
	if err := m.CheckGuest(s.guestImage()); err != nil {
		return err
	}
	// The VMM's own facts are checked once it runs (hypervisor
	// Restore.Check); the sizes and the command line now.
	want := s.machine()
	want.Driver, want.DriverVersion, want.MachineType, want.Devices = m.Machine.Driver, m.Machine.DriverVersion, m.Machine.MachineType, m.Machine.Devices
	if err := m.CheckMachine(want); err != nil {
		return err
	}
	if len(m.Containers) != 1 {
		return fmt.Errorf("checkpoint %s holds %d containers; only the checkpoint of a single-container sandbox can be restored: %w",
			r.opts.Dir, len(m.Containers), errdefs.ErrInvalidArgument)
	}
	r.m, r.saved = m, m.Containers[0]
	r.stateChecked = make(chan error, 1)
	go func() { r.stateChecked <- checkpoint.VerifyFile(r.opts.Dir, m, m.State) }()
	found := false
	for _, p := range r.saved.Processes {
		if p.ExecID == "" {
			r.proc, found = p, true
			break
		}
	}
	if !found {
		return fmt.Errorf("checkpoint %s: container %s has no init process: %w", r.opts.Dir, r.saved.ID, errdefs.ErrInvalidArgument)
	}
	return nil
}

// prepare makes the container's disks from the checkpoint and returns
// what the driver needs to load the state.
func (r *restoring) prepare(ctx context.Context, s *Sandbox) (_ *hypervisor.Restore, retErr error) {
	c := r.opts.Container
	ct, err := s.containers.reserve(c.ID, filepath.Join(s.containersDir, c.ID))
	if err != nil {
		return nil, err
	}
	r.ct = ct
	var tag [4]byte
	if _, err := rand.Read(tag[:]); err != nil {
		return nil, err
	}
	s.containers.mu.Lock()
	s.containers.prefix = fmt.Sprintf("r%x-", tag)
	ct.guest = r.saved.ID
	ct.policy = rootfs.PolicyFor(c.Spec)
	// Not busy: a failed restore's Stop releases it with the sandbox.
	ct.busy = false
	s.containers.mu.Unlock()

	var layers []checkpoint.Disk
	var scratch *checkpoint.Disk
	for i, d := range r.m.Disks {
		if d.Container != r.saved.ID {
			continue
		}
		switch d.Role {
		case checkpoint.RoleLayer:
			layers = append(layers, d)
		case checkpoint.RoleScratch:
			if scratch != nil {
				return nil, r.refuse("container %s has two scratch disks", r.saved.ID)
			}
			scratch = &r.m.Disks[i]
		}
	}
	var opts []rootfs.PrepareOpt
	if scratch != nil {
		if scratch.Size <= 0 || scratch.Size > maxRestoredScratch {
			return nil, r.refuse("scratch disk %s: size %d is out of range", scratch.ID, scratch.Size)
		}
		opts = append(opts, rootfs.WithScratchFrom(func(dst *os.File) error {
			return r.writeScratch(dst, scratch)
		}))
	}
	ct.rootfs, err = s.rootfs.Prepare(ctx, c.Rootfs, ct.dir, opts...)
	if err != nil {
		return nil, fmt.Errorf("container %s: rootfs: %w", c.ID, err)
	}
	switch {
	case scratch == nil && !ct.rootfs.ReadOnly():
		return nil, fmt.Errorf("container %s: the checkpoint's container has a read-only root, the new one a writable one: %w", c.ID, errdefs.ErrInvalidArgument)
	case scratch != nil && ct.rootfs.ReadOnly():
		return nil, fmt.Errorf("container %s: the checkpoint's container has a writable root, the new one a read-only one: %w", c.ID, errdefs.ErrInvalidArgument)
	}
	if len(layers) != len(ct.rootfs.Layers) {
		return nil, fmt.Errorf("container %s: its image has %d layers, the checkpoint's container had %d: %w", c.ID, len(ct.rootfs.Layers), len(layers), errdefs.ErrInvalidArgument)
	}
	digester, ok := s.rootfs.(RootfsDigester)
	if !ok {
		return nil, fmt.Errorf("restore: the layer cache cannot name its layers by digest: %w", errdefs.ErrNotImplemented)
	}
	paths := map[string]string{}
	for i, d := range layers {
		got, err := digester.LayerDigest(ct.rootfs.Layers[i])
		if err != nil {
			return nil, fmt.Errorf("container %s: layer %d: %w", c.ID, i, err)
		}
		if got != d.Digest {
			return nil, fmt.Errorf("container %s: layer %d (disk %s) is %s, the checkpoint was saved with %s: the image is not the one checkpointed: %w",
				c.ID, i, d.ID, got, d.Digest, errdefs.ErrInvalidArgument)
		}
		paths[d.ID] = ct.rootfs.Layers[i]
	}
	if scratch != nil {
		paths[scratch.ID] = ct.rootfs.Scratch
	}
	var disks []hypervisor.Disk
	for _, d := range r.m.Disks {
		p, ok := paths[d.ID]
		if !ok {
			return nil, r.refuse("disk %s belongs to no container of the checkpoint", d.ID)
		}
		disks = append(disks, hypervisor.Disk{ID: d.ID, Path: p, ReadOnly: d.ReadOnly, Addr: hypervisor.DiskAddr{SCSIID: d.Addr.SCSIID, LUN: d.Addr.LUN}})
		ct.disks = append(ct.disks, d.ID)
	}
	state, err := checkpoint.Open(r.opts.Dir, r.m, r.m.State)
	if err != nil {
		return nil, err
	}
	return &hypervisor.Restore{
		State:  state,
		Disks:  disks,
		Resume: true,
		Check: func(hm hypervisor.Machine) error {
			select {
			case err := <-r.stateChecked:
				if err != nil {
					return err
				}
			case <-ctx.Done():
				return fmt.Errorf("verify the VM state of checkpoint %s: %w", r.opts.Dir, ctx.Err())
			}
			want := s.machine()
			want.Driver, want.DriverVersion, want.MachineType = hm.Driver, hm.Version, hm.Type
			want.Devices = append([]string(nil), hm.Devices...)
			return r.m.CheckMachine(want)
		},
	}, nil
}

// writeScratch writes the checkpoint's copy of a scratch disk into dst.
func (r *restoring) writeScratch(dst *os.File, d *checkpoint.Disk) error {
	src, err := checkpoint.Open(r.opts.Dir, r.m, d.File)
	if err != nil {
		return err
	}
	defer src.Close()
	info, err := checkpoint.ReadSparse(src, dst, maxRestoredScratch)
	if err != nil {
		return fmt.Errorf("scratch disk %s from %s: %w", d.ID, d.File, err)
	}
	if info.Size != d.Size {
		return r.refuse("scratch disk %s: %s holds %d bytes, the manifest says %d", d.ID, d.File, info.Size, d.Size)
	}
	return nil
}

// reattach thaws the restored guest's filesystems (they were frozen for
// the save) and hands the init's stdio to the new task.
func (r *restoring) reattach(ctx context.Context, s *Sandbox) error {
	if err := s.agent.ThawFilesystems(ctx); err != nil {
		return fmt.Errorf("thaw the restored guest's filesystems: %w", err)
	}
	c, p := r.opts.Container, r.proc
	spec := agent.AttachSpec{ID: p.GuestID, Terminal: p.Terminal}
	if p.Stdin && c.Stdin != nil {
		spec.Stdin = c.Stdin
	}
	if p.Stdout && c.Stdout != nil {
		spec.Stdout = c.Stdout
	}
	if p.Stderr && !p.Terminal && c.Stderr != nil {
		spec.Stderr = c.Stderr
	}
	init, err := s.agent.AttachProcess(ctx, spec)
	if err != nil {
		return fmt.Errorf("attach the stdio of container %s's init: %w", c.ID, err)
	}
	s.containers.mu.Lock()
	r.ct.init = init
	r.ct.stdio = stdioShape{Terminal: p.Terminal, Stdin: spec.Stdin != nil, Stdout: spec.Stdout != nil, Stderr: spec.Stderr != nil}
	r.ct.restored = true
	s.containers.mu.Unlock()
	r.init = init
	log.G(ctx).WithFields(log.Fields{"container": c.ID, "saved_as": r.saved.ID, "process": p.GuestID, "pid": init.Pid()}).Info("container restored")
	return nil
}

// refuse is the error of a checkpoint whose manifest does not hold
// together.
func (r *restoring) refuse(format string, args ...any) error {
	return fmt.Errorf("checkpoint %s: %s: %w: %w", r.opts.Dir, fmt.Sprintf(format, args...), checkpoint.ErrInvalid, errdefs.ErrInvalidArgument)
}
