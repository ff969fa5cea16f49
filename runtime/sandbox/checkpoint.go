package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/checkpoint"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/image"
)

// stdioShape is which standard streams a process has.
type stdioShape struct {
	Terminal, Stdin, Stdout, Stderr bool
}

// CheckpointOptions say what Checkpoint saves and where.
type CheckpointOptions struct {
	// Dir is the empty directory the checkpoint is written to
	// (containerd's, which it then stores whole).
	Dir string
	// ContainerID is the container the checkpoint was asked for: the
	// sandbox's only container, since a checkpoint captures the VM.
	ContainerID string
	// Exit ends the container's processes once saved (runc's --exit);
	// otherwise it runs on.
	Exit bool
	// Paused says the container is paused already, as ctr and CRI pause
	// it before they checkpoint; otherwise Checkpoint pauses it for the
	// save and resumes it after.
	Paused bool
	// Namespace is recorded as the checkpoint's owner.
	Namespace string
}

// CheckpointReport says what a checkpoint took.
type CheckpointReport struct {
	// StateBytes is the VM state (memory, vCPUs, devices); DiskBytes the
	// scratch disks as stored, DiskDataBytes the data they hold.
	StateBytes    int64
	DiskBytes     int64
	DiskDataBytes int64
	// VMPaused is how long the guest's vCPUs were stopped; Took the
	// whole checkpoint.
	VMPaused time.Duration
	Took     time.Duration
}

// RootfsDigester is the part of the layer cache a checkpoint needs: the
// digest of a layer image it prepared.
type RootfsDigester interface {
	LayerDigest(img string) (string, error)
}

// Checkpoint saves the whole VM into o.Dir: the guest's memory and
// device state, its scratch disks, and a manifest describing the machine,
// the guest image, the layers and the container's processes. The guest's
// filesystems are frozen and its vCPUs paused while the state and disks
// are written, so that they are consistent; the container's writable
// layer reaches the host first (for checkpoint --rw). Afterwards the
// sandbox runs on, or with o.Exit the container's processes are killed.
//
// A sandbox with more than one container is refused: the checkpoint of
// one container of a pod would capture the others too. On error the VM
// runs on as before and what was written to o.Dir is removed.
func (s *Sandbox) Checkpoint(ctx context.Context, o CheckpointOptions) (rep CheckpointReport, retErr error) {
	began := time.Now()
	ct, leave, err := s.enter(o.ContainerID, "checkpoint")
	if err != nil {
		return rep, err
	}
	defer leave()
	if !s.checkpointing.TryLock() {
		return rep, fmt.Errorf("checkpoint container %s: another checkpoint of the sandbox is being written: %w", ct.id, errdefs.ErrFailedPrecondition)
	}
	defer s.checkpointing.Unlock()
	if others := s.containers.others(ct); len(others) > 0 {
		return rep, fmt.Errorf("checkpoint container %s: the sandbox also runs %s, and a checkpoint captures the whole VM: "+
			"checkpointing one container of a pod is not supported: %w", ct.id, strings.Join(others, ", "), errdefs.ErrFailedPrecondition)
	}
	if s.host.share != nil {
		// vhost-user-fs cannot be saved: QEMU marks it unmigratable, and
		// the host directories are not the VM's to capture.
		return rep, fmt.Errorf("checkpoint container %s: the sandbox shares host directories with the VM (bind mounts, through virtio-fs), which a checkpoint cannot capture: %w", ct.id, errdefs.ErrFailedPrecondition)
	}
	snap, ok := s.vm.(hypervisor.Snapshotter)
	if !ok {
		return rep, fmt.Errorf("checkpoint: the hypervisor driver cannot save a VM: %w", errdefs.ErrNotImplemented)
	}
	digester, ok := s.rootfs.(RootfsDigester)
	if !ok {
		return rep, fmt.Errorf("checkpoint: the layer cache cannot name its layers by digest: %w", errdefs.ErrNotImplemented)
	}
	if ct.init == nil {
		return rep, fmt.Errorf("checkpoint container %s: it is not created yet: %w", ct.id, errdefs.ErrFailedPrecondition)
	}
	// containerd hands over a directory it made; a client's own image
	// path (ctr task checkpoint --image-path) may not exist yet, and is
	// made as CRIU would, and removed again if the checkpoint fails.
	made := false
	var w *checkpoint.Writer
	defer func() {
		if retErr == nil {
			return
		}
		if w != nil {
			w.Abort()
		}
		if made {
			os.Remove(o.Dir)
		}
	}()
	if _, err := os.Lstat(o.Dir); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(o.Dir, 0o700); err != nil {
			return rep, fmt.Errorf("checkpoint: %w", err)
		}
		made = true
	}
	if w, err = checkpoint.NewWriter(o.Dir); err != nil {
		return rep, err
	}
	lg := log.G(ctx).WithField("container", ct.id)

	// The container is frozen from here to the end: its writes reach
	// the host, and its processes are not running while the guest's
	// clock and entropy are set after a restore (StartContainer thaws
	// it there).
	if !o.Paused {
		if err := s.agent.PauseContainer(ctx, ct.guest); err != nil {
			return rep, fmt.Errorf("checkpoint: pause container %s: %w", ct.id, err)
		}
		// With exit its processes were killed frozen; thawed, they end.
		defer func() {
			if err := s.agent.ResumeContainer(context.WithoutCancel(ctx), ct.guest); err != nil {
				lg.WithError(err).Warn("resume the container after its checkpoint")
			}
		}()
		// A paused container's layer reached the host at the pause.
		s.syncLayer(ctx, ct)
	}
	frozen, err := s.agent.FreezeFilesystems(ctx)
	if err != nil {
		return rep, fmt.Errorf("checkpoint: freeze the guest's filesystems: %w", err)
	}
	thawed := false
	thaw := func() {
		if thawed {
			return
		}
		thawed = true
		if err := s.agent.ThawFilesystems(context.WithoutCancel(ctx)); err != nil {
			lg.WithError(err).Error("thaw the guest's filesystems after a checkpoint")
		}
	}
	defer thaw()

	saved, m, err := s.saveVM(ctx, snap, w, ct, digester, &rep)
	if err != nil {
		return rep, err
	}
	m.Namespace = o.Namespace
	if o.Exit {
		// The processes end before the guest's filesystems thaw: nothing
		// they would write after the save reaches the scratch disk.
		if err := s.agent.KillContainer(ctx, ct.guest, syscall.SIGKILL, true); err != nil && !errdefs.IsNotFound(err) {
			return rep, fmt.Errorf("checkpoint --exit: kill container %s: %w", ct.id, err)
		}
	}
	thaw()
	if err := w.Finish(m); err != nil {
		return rep, err
	}
	rep.Took = time.Since(began)
	lg.WithFields(log.Fields{
		"dir": o.Dir, "state_bytes": rep.StateBytes, "disk_bytes": rep.DiskBytes, "frozen_filesystems": frozen,
		"disks": len(saved.Disks), "vm_paused_ms": rep.VMPaused.Milliseconds(), "took_ms": rep.Took.Milliseconds(), "exit": o.Exit,
	}).Info("checkpoint written")
	return rep, nil
}

// saveVM pauses the VM, writes its state and scratch disks through w and
// resumes it, and returns the manifest of what it wrote (the caller
// finishes it).
func (s *Sandbox) saveVM(ctx context.Context, snap hypervisor.Snapshotter, w *checkpoint.Writer, ct *container, digester RootfsDigester, rep *CheckpointReport) (_ hypervisor.SavedState, _ *checkpoint.Manifest, retErr error) {
	var saved hypervisor.SavedState
	// Phases: Ready -> Paused -> Saving -> Paused -> Ready. Container
	// calls made meanwhile are refused as "paused" rather than left to
	// hang on a guest that cannot answer.
	if err := s.life.to(PhasePaused); err != nil {
		return saved, nil, err
	}
	pausedAt := time.Now()
	resumed := false
	resume := func() error {
		if resumed {
			return nil
		}
		resumed = true
		err := snap.Resume(context.WithoutCancel(ctx))
		rep.VMPaused = time.Since(pausedAt)
		if err != nil {
			return fmt.Errorf("checkpoint: resume the VM: %w", err)
		}
		return s.life.to(PhaseReady)
	}
	defer func() {
		if err := resume(); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()
	if err := snap.Pause(ctx); err != nil {
		return saved, nil, fmt.Errorf("checkpoint: pause the VM: %w", err)
	}
	f, err := w.Add(checkpoint.StateName)
	if err != nil {
		return saved, nil, err
	}
	if err := s.life.to(PhaseSaving); err != nil {
		f.Close()
		return saved, nil, err
	}
	saved, err = snap.Save(ctx, f)
	f.Close()
	if perr := s.life.to(PhasePaused); err == nil {
		err = perr
	}
	if err != nil {
		return saved, nil, fmt.Errorf("checkpoint: save the VM: %w", err)
	}
	rep.StateBytes = saved.Bytes
	disks, err := s.saveDisks(w, ct, saved.Disks, digester, rep)
	if err != nil {
		return saved, nil, err
	}
	if err := resume(); err != nil {
		return saved, nil, err
	}
	return saved, s.manifest(ct, disks), nil
}

// saveDisks records the disks the VM had: layer images by digest (the
// cache has them, or rebuilds them to the same bytes), scratch disks
// copied, holes and zero blocks left out, while the guest is paused.
func (s *Sandbox) saveDisks(w *checkpoint.Writer, ct *container, attached []hypervisor.Disk, digester RootfsDigester, rep *CheckpointReport) ([]checkpoint.Disk, error) {
	layers := map[string]bool{}
	for _, l := range ct.rootfs.Layers {
		layers[l] = true
	}
	var out []checkpoint.Disk
	for _, d := range attached {
		cd := checkpoint.Disk{ID: d.ID, Addr: checkpoint.DiskAddr{SCSIID: d.Addr.SCSIID, LUN: d.Addr.LUN}, ReadOnly: d.ReadOnly, Container: ct.guest}
		switch {
		case layers[d.Path] && d.ReadOnly:
			digest, err := digester.LayerDigest(d.Path)
			if err != nil {
				return nil, fmt.Errorf("checkpoint: layer disk %s: %w", d.ID, err)
			}
			cd.Role, cd.Digest = checkpoint.RoleLayer, digest
		case d.Path == ct.rootfs.Scratch && !d.ReadOnly:
			info, file, stored, err := saveScratch(w, d)
			if err != nil {
				return nil, err
			}
			cd.Role, cd.File, cd.Size = checkpoint.RoleScratch, file, info.Size
			rep.DiskDataBytes += info.DataBytes
			rep.DiskBytes += stored
		default:
			return nil, fmt.Errorf("checkpoint: disk %s (%s) belongs to no container of the sandbox: %w", d.ID, d.Path, errdefs.ErrFailedPrecondition)
		}
		out = append(out, cd)
	}
	return out, nil
}

// saveScratch writes a scratch disk's data into the checkpoint and
// returns what it held, the file's name and its size.
func saveScratch(w *checkpoint.Writer, d hypervisor.Disk) (info checkpoint.SparseInfo, name string, stored int64, err error) {
	name = "disk-" + d.ID + ".sparse"
	src, err := os.Open(d.Path)
	if err != nil {
		return info, "", 0, fmt.Errorf("checkpoint: scratch disk %s: %w", d.ID, err)
	}
	defer src.Close()
	dst, err := w.Add(name)
	if err != nil {
		return info, "", 0, err
	}
	defer dst.Close()
	if info, err = checkpoint.WriteSparse(dst, src); err != nil {
		return info, "", 0, fmt.Errorf("checkpoint: copy scratch disk %s: %w", d.ID, err)
	}
	fi, err := dst.Stat()
	if err != nil {
		return info, "", 0, fmt.Errorf("checkpoint: copy scratch disk %s: %w", d.ID, err)
	}
	return info, name, fi.Size(), nil
}

// manifest describes the sandbox for a checkpoint of ct.
func (s *Sandbox) manifest(ct *container, disks []checkpoint.Disk) *checkpoint.Manifest {
	m := &checkpoint.Manifest{
		Created:   time.Now().UTC(),
		SandboxID: s.ID,
		Machine:   s.machine(),
		Guest:     s.guestImage(),
		State:     checkpoint.StateName,
		Disks:     disks,
	}
	m.Containers = []checkpoint.Container{{
		ID: ct.guest,
		Processes: []checkpoint.Process{{
			GuestID:  ct.init.ID(),
			Pid:      ct.init.Pid(),
			Terminal: ct.stdio.Terminal,
			Stdin:    ct.stdio.Stdin,
			Stdout:   ct.stdio.Stdout,
			Stderr:   ct.stdio.Stderr,
		}},
	}}
	return m
}

// machine is what a saved state of this sandbox depends on.
func (s *Sandbox) machine() checkpoint.Machine {
	m := checkpoint.Machine{
		VCPUs:      s.spec.VCPUs,
		MemoryMiB:  s.spec.MemoryMiB,
		Accel:      string(s.spec.Accel),
		Channel:    string(s.spec.Channel),
		KernelArgs: append([]string(nil), s.spec.KernelArgs...),
	}
	if d, ok := s.vm.(hypervisor.Describer); ok {
		hm := d.Machine()
		m.Driver, m.DriverVersion, m.MachineType = hm.Driver, hm.Version, hm.Type
		m.Devices = append([]string(nil), hm.Devices...)
	}
	return m
}

// guestImage names the guest image the sandbox runs.
func (s *Sandbox) guestImage() checkpoint.GuestImage { return GuestImageOf(s.image) }

// guestImageOf names a guest image by its files' digests.
func GuestImageOf(img *image.Image) checkpoint.GuestImage {
	if img == nil {
		return checkpoint.GuestImage{}
	}
	mf := img.Manifest
	return checkpoint.GuestImage{Version: mf.Kernel.Release, Kernel: "sha256:" + mf.Kernel.SHA256, Initrd: "sha256:" + mf.Initrd.SHA256}
}

// others lists the containers of the sandbox other than ct, sorted.
func (c *containers) others(ct *container) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for id, o := range c.byID {
		if o != ct {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}
