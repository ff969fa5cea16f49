package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	cgroupsv2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/agent"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/rootfs"
)

// ContainersDirName is the directory under runtime.data_dir that holds,
// per sandbox, each container's scratch disk: on disk, not in the
// tmpfs of the state directory, as it holds what the container writes.
const ContainersDirName = "containers"

// deathGrace is how long a call that lost the agent session waits to
// learn that the sandbox died.
const deathGrace = time.Second

// guestUndoTimeout bounds the guest-side undo of a failed create.
const guestUndoTimeout = 10 * time.Second

// RootfsCache turns containerd's rootfs mounts into disk images and gives
// them back: runtime/rootfs's Cache.
type RootfsCache interface {
	// Prepare makes the layer images and the scratch disk in dir.
	Prepare(ctx context.Context, mounts []rootfs.Mount, dir string, opts ...rootfs.PrepareOpt) (rootfs.Rootfs, error)
	// Release gives back what Prepare made, once the VM no longer uses it.
	Release(ctx context.Context, r rootfs.Rootfs) error
	// CopyBack applies the container's writable layer, which export
	// streams from the guest, to the host's upperdir (or directory root)
	// through the container's policy, while the VM runs.
	CopyBack(ctx context.Context, r rootfs.Rootfs, p rootfs.Policy, export rootfs.Exporter) (rootfs.CopyBackReport, error)
}

var _ RootfsCache = (*rootfs.Cache)(nil)

// ContainerSpec is a container to create in the sandbox.
type ContainerSpec struct {
	// ID is the containerd container id.
	ID string
	// Spec is the bundle's config.json as containerd wrote it (the host
	// view); oci.GuestSpec translates it.
	Spec *specs.Spec
	// Rootfs are the mounts of CreateTaskRequest.Rootfs.
	Rootfs []rootfs.Mount
	// Stdin, if set, is copied to the init process; nil: not attached.
	Stdin io.Reader
	// Stdout and Stderr, if set, receive the init's output. With a
	// terminal the output is on Stdout and Stderr is not used.
	Stdout, Stderr io.Writer
}

// containers is the sandbox's bookkeeping of its containers. The zero
// value is ready.
type containers struct {
	// mu guards every field. It is never held across a guest call or a
	// disk attach.
	mu   sync.Mutex
	byID map[string]*container
	// seq numbers the guest process ids, after prefix ("p" in a booted
	// sandbox; a restored one's guest still knows the ids of the sandbox
	// it was saved from, so it takes a prefix of its own).
	seq    uint64
	prefix string
	// closed is set once the sandbox stopped.
	closed bool
	// events is Events' channel, made on the first call; loopDone is
	// closed when the loop feeding it ends, stopLoop ends it.
	events   chan Event
	loopDone chan struct{}
	stopLoop context.CancelFunc
}

// container is one container of the sandbox, as the host knows it.
type container struct {
	id string
	// guest is the id the guest knows the container by: id, or for a
	// container restored from a checkpoint under a new id, the id it
	// had when saved.
	guest string
	// stdio is the shape of the init's stdio, which a checkpoint
	// records so that a restore can attach it again.
	stdio stdioShape
	// restored is set for a container brought back from a checkpoint
	// until StartContainer thaws it: its processes run already, frozen
	// since the save.
	restored bool
	// dir is the container's directory under the data dir.
	dir string
	// busy is set while the container is created or deleted; guarded
	// by containers.mu.
	busy bool
	// init is the container's init process; set once created.
	init *agent.Process
	// rootfs is what the cache prepared.
	rootfs rootfs.Rootfs
	// disks are the ids of the attached disks, in attach order.
	disks []string
	// policy is what the container's writes may put into the host's
	// directories (rootfs.PolicyFor its spec).
	policy rootfs.Policy
	// copiedBack is set once the writable layer was copied back, or the
	// copy back failed for good (copyBack).
	copiedBack bool
	// user retries the exec user's provisioning after a failed first
	// attempt; nil when none is needed. Set with init.
	user *userProvisioner
}

// processID returns a new short guest process id: the agent's ids are
// bounded to 64 characters, container and exec ids are not.
func (c *containers) processID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	if c.prefix == "" {
		c.prefix = "p"
	}
	return fmt.Sprintf("%s%d", c.prefix, c.seq)
}

// reserve records a container being created.
func (c *containers) reserve(id, dir string) (*container, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("sandbox is stopped: %w", errdefs.ErrFailedPrecondition)
	}
	if c.byID == nil {
		c.byID = make(map[string]*container)
	}
	if _, ok := c.byID[id]; ok {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrAlreadyExists)
	}
	ct := &container{id: id, guest: id, dir: dir, busy: true}
	c.byID[id] = ct
	return ct, nil
}

// get returns a container that is not being created or deleted.
func (c *containers) get(id string) (*container, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ct, ok := c.byID[id]
	if !ok {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	if ct.busy && ct.init == nil {
		return nil, fmt.Errorf("container %s is still being created: %w", id, errdefs.ErrFailedPrecondition)
	}
	return ct, nil
}

// initPID is the guest pid of container id's init; 0 when there is no
// such container, or it is not created yet.
func (c *containers) initPID(id string) uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ct, ok := c.byID[id]; ok && ct.init != nil {
		return ct.init.Pid()
	}
	return 0
}

func (c *containers) remove(ct *container) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byID[ct.id] == ct {
		delete(c.byID, ct.id)
	}
}

func (c *containers) setBusy(ct *container, busy bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if busy && ct.busy {
		return fmt.Errorf("container %s is being deleted: %w", ct.id, errdefs.ErrFailedPrecondition)
	}
	ct.busy = busy
	return nil
}

// CreateContainer creates a container in the guest: the spec is
// translated for the guest, the rootfs made into disks and hot-plugged,
// and the agent runs `runc create`. The returned Process is the init,
// which runs its entrypoint once StartContainer is called. On error
// nothing is left behind.
func (s *Sandbox) CreateContainer(ctx context.Context, c ContainerSpec) (_ *agent.Process, retErr error) {
	if err := ValidName("container id", c.ID); err != nil {
		return nil, err
	}
	leave, err := s.calls.enter("create container " + c.ID)
	if err != nil {
		return nil, err
	}
	defer leave()
	if err := s.life.require("create container "+c.ID, PhaseReady); err != nil {
		return nil, err
	}
	guest, err := oci.GuestSpec(c.Spec, c.ID)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.ID, err)
	}
	podPID := s.containers.initPID(c.Spec.Annotations[oci.AnnotationCRISandboxID])
	if err := oci.JoinPod(guest, uint32(s.vm.PID()), podPID); err != nil {
		return nil, fmt.Errorf("container %s: %w", c.ID, err)
	}
	if s.rootfs == nil {
		return nil, fmt.Errorf("container %s: the sandbox was started without a layer cache: %w", c.ID, errdefs.ErrFailedPrecondition)
	}
	first := !s.created.Swap(true)
	pol, err := s.containerUser(ctx, c)
	if err != nil {
		return nil, err
	}
	attacher, ok := s.vm.(hypervisor.DiskAttacher)
	if !ok {
		return nil, fmt.Errorf("container %s: the hypervisor driver cannot hot-plug disks: %w", c.ID, errdefs.ErrNotImplemented)
	}
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("container", c.ID))
	ct, err := s.containers.reserve(c.ID, filepath.Join(s.containersDir, c.ID))
	if err != nil {
		return nil, err
	}
	ct.policy = rootfs.PolicyFor(c.Spec)
	cleanupCtx := context.WithoutCancel(ctx)
	defer func() {
		if retErr != nil {
			if err := s.releaseContainer(cleanupCtx, attacher, ct); err != nil {
				log.G(ctx).WithError(err).Warn("undo container create")
			}
			s.containers.remove(ct)
		}
	}()

	if err := s.shareBinds(ctx, c); err != nil {
		return nil, err
	}
	ct.rootfs, err = s.rootfs.Prepare(ctx, c.Rootfs, ct.dir)
	if err != nil {
		return nil, fmt.Errorf("container %s: rootfs: %w", c.ID, err)
	}
	var disks agent.Rootfs
	for i, layer := range ct.rootfs.Layers {
		addr, err := s.attach(ctx, attacher, ct, fmt.Sprintf("%s-layer-%d", c.ID, i), layer, true)
		if err != nil {
			return nil, err
		}
		disks.Layers = append(disks.Layers, agent.Disk{SCSIID: addr.SCSIID, LUN: addr.LUN, FSType: rootfs.LayerFSType, ReadOnly: true})
	}
	if ct.rootfs.Scratch != "" {
		addr, err := s.attach(ctx, attacher, ct, c.ID+"-scratch", ct.rootfs.Scratch, false)
		if err != nil {
			return nil, err
		}
		disks.Scratch = &agent.Disk{SCSIID: addr.SCSIID, LUN: addr.LUN, FSType: rootfs.ScratchFSType}
	}

	specJSON, err := json.Marshal(guest)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.ID, err)
	}
	stderr := c.Stderr
	if guest.Process.Terminal {
		// A terminal has one output, on Stdout.
		stderr = nil
	}
	var provision *agent.UserProvision
	if pol != nil {
		switch bound, err := s.userBound(pol, first); {
		case err == nil:
			provision = &agent.UserProvision{ExecUser: pol.user, Timeout: bound, Required: pol.required}
		case pol.required:
			return nil, fmt.Errorf("container %s: %w", c.ID, err)
		default:
			log.G(ctx).WithError(err).Warn("exec user not provisioned")
		}
	}
	init, outcome, err := s.agent.CreateContainerWithUser(ctx, agent.ContainerCreate{
		ID:        c.ID,
		ProcessID: s.containers.processID(),
		Spec:      specJSON,
		Rootfs:    disks,
		Stdin:     c.Stdin,
		Stdout:    c.Stdout,
		Stderr:    stderr,
	}, provision)
	if err != nil {
		// A create the guest finished after ctx gave up must not keep
		// mounts on disks about to be detached.
		dctx, cancel := context.WithTimeout(cleanupCtx, guestUndoTimeout)
		if derr := s.agent.DeleteContainer(dctx, c.ID); derr != nil && !errdefs.IsNotFound(derr) {
			log.G(ctx).WithError(derr).Warn("undo container create in the guest")
		}
		cancel()
		return nil, err
	}
	var retries *userProvisioner
	if provision != nil {
		retries = s.afterCreate(ctx, ct, pol, outcome)
	}
	s.containers.mu.Lock()
	ct.init = init
	ct.user = retries
	ct.stdio = stdioShape{Terminal: guest.Process.Terminal, Stdin: c.Stdin != nil, Stdout: c.Stdout != nil, Stderr: stderr != nil}
	ct.busy = false
	s.containers.mu.Unlock()
	if retries != nil {
		retries.start(init)
	}
	log.G(ctx).WithField("process", init.ID()).WithField("pid", init.Pid()).WithField("disks", len(ct.disks)).Info("container created")
	return init, nil
}

// attach hot-plugs one disk of ct and records it for the undo.
func (s *Sandbox) attach(ctx context.Context, a hypervisor.DiskAttacher, ct *container, id, path string, readOnly bool) (hypervisor.DiskAddr, error) {
	addr, err := a.AttachDisk(ctx, id, path, readOnly)
	if err != nil {
		return addr, fmt.Errorf("container %s: %w", ct.id, err)
	}
	ct.disks = append(ct.disks, id)
	return addr, nil
}

// releaseContainer detaches ct's disks (newest first), gives its rootfs
// back to the cache and removes its directory. Disks that failed to
// detach stay recorded, so that a retry tries them again; with any
// failure the rootfs is kept, as the VM may still use it.
func (s *Sandbox) releaseContainer(ctx context.Context, a hypervisor.DiskAttacher, ct *container) error {
	var errs []error
	if err := s.unshareBinds(ct.id); err != nil {
		errs = append(errs, err)
	}
	var kept []string
	for i := len(ct.disks) - 1; i >= 0; i-- {
		if a == nil {
			break
		}
		if err := a.DetachDisk(ctx, ct.disks[i]); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("detach disk %s: %w", ct.disks[i], err))
			kept = append([]string{ct.disks[i]}, kept...)
		}
	}
	if a != nil {
		ct.disks = kept
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if s.rootfs != nil && (len(ct.rootfs.Layers) > 0 || ct.rootfs.Scratch != "") {
		if err := s.rootfs.Release(ctx, ct.rootfs); err != nil {
			return fmt.Errorf("release rootfs: %w", err)
		}
		ct.rootfs = rootfs.Rootfs{}
	}
	if err := os.RemoveAll(ct.dir); err != nil {
		return fmt.Errorf("remove container dir: %w", err)
	}
	return nil
}

// enter admits a call that does what on container id (see callGate) in a
// sandbox in one of the phases ok (PhaseReady if none are given); the
// caller runs leave when it is done.
func (s *Sandbox) enter(id, what string, ok ...Phase) (*container, func(), error) {
	leave, err := s.calls.enter("container " + id)
	if err != nil {
		return nil, nil, err
	}
	if len(ok) == 0 {
		ok = []Phase{PhaseReady}
	}
	if err := s.life.require(what+" container "+id, ok...); err != nil {
		leave()
		return nil, nil, err
	}
	ct, err := s.containers.get(id)
	if err != nil {
		leave()
		return nil, nil, err
	}
	return ct, leave, nil
}

// dead reports whether the sandbox's VM is gone while it is not being
// stopped: the calls that must still succeed then (delete, flush, kill)
// do without the guest.
func (s *Sandbox) dead() bool {
	p, _ := s.life.current()
	return p == PhaseDead
}

// diedMeanwhile reports whether a call that found the agent session gone
// did so because the sandbox died: the session's end and the watch that
// declares the sandbox dead are one event seen from two goroutines, so
// it waits a moment for the second.
func (s *Sandbox) diedMeanwhile(ctx context.Context) bool {
	t := time.NewTimer(deathGrace)
	defer t.Stop()
	select {
	case <-s.life.dead:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return s.dead()
}

// enterBusy is enter, with the container marked busy until done: no other
// delete or flush, and Stop leaves it to this call.
func (s *Sandbox) enterBusy(id, what string) (_ *container, done func(), _ error) {
	ct, leave, err := s.enter(id, what, PhaseReady, PhaseDead)
	if err != nil {
		return nil, nil, err
	}
	if err := s.containers.setBusy(ct, true); err != nil {
		leave()
		return nil, nil, err
	}
	return ct, func() {
		_ = s.containers.setBusy(ct, false)
		leave()
	}, nil
}

// StartContainer starts the container's init.
func (s *Sandbox) StartContainer(ctx context.Context, id string) error {
	ct, leave, err := s.enter(id, "start")
	if err != nil {
		return err
	}
	defer leave()
	if s.takeRestored(ct) {
		// Its processes run since the save, frozen: starting it lets
		// them go on, now that the guest has its clock and entropy.
		return s.agent.ResumeContainer(ctx, ct.guest)
	}
	if err := s.bindLateInterfaces(ctx); err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	return s.agent.StartContainer(ctx, ct.guest)
}

// takeRestored reports whether ct was restored and not started yet, and
// marks it started.
func (s *Sandbox) takeRestored(ct *container) bool {
	s.containers.mu.Lock()
	defer s.containers.mu.Unlock()
	r := ct.restored
	ct.restored = false
	return r
}

// KillContainer signals the container's init, or with all every process
// of the container. A stopped container is errdefs.ErrNotFound.
func (s *Sandbox) KillContainer(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	ct, leave, err := s.enter(id, "signal", PhaseReady, PhaseDead)
	if err != nil {
		return err
	}
	defer leave()
	err = errdefs.ErrUnavailable
	if !s.dead() {
		err = s.agent.KillContainer(ctx, ct.guest, sig, all)
	}
	if errdefs.IsUnavailable(err) && s.diedMeanwhile(ctx) {
		// containerd and CRI take NotFound as "already gone".
		return fmt.Errorf("signal container %s: its processes ended with the sandbox's VM: %w", id, errdefs.ErrNotFound)
	}
	return err
}

// DeleteContainer copies a created or stopped container's writable layer
// back into the host's upperdir if it changed (copyBack), deletes the
// container in the guest, then detaches its disks and releases its
// rootfs.
//
// In a dead sandbox only the host's side is released: the guest and its
// disks are gone, and so are the container's unsynced writes.
func (s *Sandbox) DeleteContainer(ctx context.Context, id string) error {
	ct, done, err := s.enterBusy(id, "delete")
	if err != nil {
		return err
	}
	defer done()
	if p := s.containers.userOf(ct); p != nil {
		// No retry edits the files of a container being deleted.
		p.stop(ctx)
	}
	attacher, _ := s.vm.(hypervisor.DiskAttacher)
	if s.dead() {
		ct.disks, attacher = nil, nil
	} else {
		if err := s.copyBack(ctx, ct); err != nil {
			return err
		}
		err := s.agent.DeleteContainer(ctx, ct.guest)
		switch {
		case err == nil:
		case errdefs.IsUnavailable(err) && s.diedMeanwhile(ctx):
			ct.disks, attacher = nil, nil
		case !errdefs.IsNotFound(err):
			return err
		}
	}
	if err := s.releaseContainer(ctx, attacher, ct); err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	s.containers.remove(ct)
	log.G(ctx).WithField("container", id).Info("container deleted")
	return nil
}

// FlushContainer copies a stopped container's writable layer back into
// the host's upperdir if it changed (copyBack), for a VM that is stopped
// next: Stop then releases the rootfs without the guest unmounting
// anything or the disks being detached.
//
// In a dead sandbox there is nothing to flush: the call succeeds, and
// Stop releases the container.
func (s *Sandbox) FlushContainer(ctx context.Context, id string) error {
	ct, done, err := s.enterBusy(id, "flush")
	if err != nil {
		return err
	}
	defer done()
	if s.dead() {
		return nil
	}
	return s.copyBack(ctx, ct)
}

// PauseContainer freezes the container.
func (s *Sandbox) PauseContainer(ctx context.Context, id string) error {
	ct, leave, err := s.enter(id, "pause")
	if err != nil {
		return err
	}
	defer leave()
	if err := s.agent.PauseContainer(ctx, ct.guest); err != nil {
		return err
	}
	// What it wrote reaches the host while it is frozen, so that a
	// commit or checkpoint --rw, which pause first, sees it.
	s.syncLayer(ctx, ct)
	return nil
}

// ResumeContainer thaws the container.
func (s *Sandbox) ResumeContainer(ctx context.Context, id string) error {
	ct, leave, err := s.enter(id, "resume")
	if err != nil {
		return err
	}
	defer leave()
	return s.agent.ResumeContainer(ctx, ct.guest)
}

// UpdateContainer applies new resource limits to the container.
func (s *Sandbox) UpdateContainer(ctx context.Context, id string, r *specs.LinuxResources) error {
	ct, leave, err := s.enter(id, "update")
	if err != nil {
		return err
	}
	defer leave()
	if r == nil {
		return fmt.Errorf("update container %s: no resources: %w", id, errdefs.ErrInvalidArgument)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("update container %s: %w: %v", id, errdefs.ErrInvalidArgument, err)
	}
	return s.agent.UpdateContainer(ctx, ct.guest, data)
}

// ContainerStats returns the container's cgroup v2 statistics.
func (s *Sandbox) ContainerStats(ctx context.Context, id string) (*cgroupsv2stats.Metrics, error) {
	ct, leave, err := s.enter(id, "read the statistics of")
	if err != nil {
		return nil, err
	}
	defer leave()
	return s.agent.ContainerStats(ctx, ct.guest)
}

// ContainerPids lists the guest pids of the container's processes.
func (s *Sandbox) ContainerPids(ctx context.Context, id string) ([]uint32, error) {
	ct, leave, err := s.enter(id, "list the processes of")
	if err != nil {
		return nil, err
	}
	defer leave()
	return s.agent.ContainerPids(ctx, ct.guest)
}

// closeContainers ends the event loop and gives back the rootfs of every
// container left; the VM is gone, and its disks with it. Idempotent.
func (s *Sandbox) closeContainers(ctx context.Context) error {
	c := &s.containers
	c.mu.Lock()
	c.closed = true
	stop, done := c.stopLoop, c.loopDone
	c.stopLoop = nil
	// A container being created or deleted is left to that call, which
	// fails now that the agent is gone and undoes its own work.
	left := make([]*container, 0, len(c.byID))
	for id, ct := range c.byID {
		if !ct.busy {
			left = append(left, ct)
			delete(c.byID, id)
		}
	}
	c.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	var errs []error
	for _, ct := range left {
		if p := c.userOf(ct); p != nil {
			p.stop(ctx)
		}
		ct.disks = nil
		if err := s.releaseContainer(ctx, nil, ct); err != nil {
			errs = append(errs, fmt.Errorf("container %s: %w", ct.id, err))
		}
	}
	if s.containersDir != "" {
		if err := os.RemoveAll(s.containersDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
