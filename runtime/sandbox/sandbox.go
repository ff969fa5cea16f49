// Package sandbox runs the lifecycle of one microVM: launch the VMM, wait
// for the guest agent, give the guest its identity, and stop it again
// leaving nothing behind. It knows nothing of containerd; the shim and the
// cocoon CLI both drive it.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/agent"
	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/image"
	"github.com/cocoonrt/cocoon/runtime/share"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// consoleTailLines is how much of the guest console an error carries.
const consoleTailLines = 25

// deadStopTimeout bounds the end of the VM of a dead sandbox: its guest
// is not asked for anything, so QEMU gets little time to quit before the
// signals.
const deadStopTimeout = time.Second

// exitGrace is how long a failed start waits to learn whether the VMM has
// exited, to report that rather than the channel error it caused.
const exitGrace = 200 * time.Millisecond

// StateFile is the file in a sandbox's state directory that records it.
// It is written before the VMM starts so that a separate process can
// always find and undo what a crashed one left.
const StateFile = "sandbox.json"

// State is what StateFile records.
type State struct {
	// Namespace and ID name the sandbox.
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
	// Driver is the hypervisor driver that runs the VM.
	Driver string `json:"driver"`
	// Created is when the sandbox was created.
	Created time.Time `json:"created"`
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,75}$`)

// ValidName checks a namespace or sandbox id the way containerd does, so
// that it is safe as a path element.
func ValidName(what, s string) error {
	if !namePattern.MatchString(s) {
		return fmt.Errorf("%s %q: %w: want 1-76 characters of [A-Za-z0-9_.-], starting alphanumeric", what, s, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Options are what Start needs.
type Options struct {
	// Namespace and ID name the sandbox; its state lives in
	// <runtime.state_dir>/<Namespace>/<ID>.
	Namespace string
	ID        string
	// Config is the validated configuration.
	Config config.Config
	// Driver launches the VM.
	Driver hypervisor.Driver
	// Image is the guest image; Start verifies it.
	Image *image.Image
	// AccelHost and ChannelHost are the host facts that selection uses.
	AccelHost   hypervisor.AccelHost
	ChannelHost channel.Host
	// Rootfs is the layer cache that turns containers' rootfs mounts into
	// disks; without it CreateContainer fails.
	Rootfs RootfsCache
	// Template, if set, is the verified template (of this sandbox's
	// shape, ShapeOf) the VM starts from instead of booting: its memory
	// mapped copy-on-write, its state loaded, then the guest given its
	// identity as after a boot. Restore ignores it.
	Template *template.Template
	// NetNS is the path of the network namespace whose interfaces the
	// VM mirrors (the container's or pod's, made by CNI or Docker); ""
	// for none: the guest has loopback only.
	NetNS string
	// NewNetNS makes a network namespace on the host for the sandbox,
	// which the VM mirrors (oci.HostNetwork's create); NetNS is then "".
	// It is bind-mounted in the state directory and removed with it.
	NewNetNS bool
	// SpareNICs are NICs the VM gets beyond its namespace's interfaces,
	// on taps that forward nothing, for interfaces that its client adds
	// after the boot (oci.LateNetwork); the first container's start
	// binds them. Only with a namespace.
	SpareNICs int
	// HoldNetNS keeps a process in the namespace joined (NetNS) whose
	// pid OCI hooks get (HookPID); a namespace made is always held.
	HoldNetNS bool
	// BeforeNetwork, if set, runs once the namespace is made and held,
	// before its interfaces are read: the first container's prestart,
	// createRuntime and createContainer hooks, which fill it. Its error
	// ends the start.
	BeforeNetwork func(ctx context.Context, hookPID int) error
	// UndoNetwork, if set, runs when the start fails after BeforeNetwork
	// ran, before anything is torn down: the poststop hooks, which undo
	// what the hooks did (CNI's DEL) while the namespace is there.
	UndoNetwork func(ctx context.Context, hookPID int)
	// Share gives the VM a virtio-fs share for its containers' bind
	// mounts. A container with bind mounts in a sandbox without one is
	// refused.
	Share bool

	// memory is the RAM file of a template's own VM (MakeTemplate).
	memory *hypervisor.MemoryFile
	// unwatched leaves the VM's end unwatched: a template's own VM and a
	// spare's, whose agent sessions are ended once they are ready.
	unwatched bool
	// spare is the spare VM of Template that the start takes over
	// instead of launching one (startFromSpare sets both).
	spare *claimedSpare
}

// Sandbox is one running microVM with a ready agent.
type Sandbox struct {
	// Namespace and ID name the sandbox.
	Namespace string
	ID        string
	// Dir is the sandbox's state directory.
	Dir string
	// Accel and Channel are what was selected, with the reasons.
	Accel         hypervisor.Accel
	AccelReason   string
	Channel       channel.Kind
	ChannelReason string
	// ReadyIn is the time from VMM launch to the agent's first answer.
	ReadyIn time.Duration
	// Template is the key of the template the VM started from; "" for a
	// boot or a restore.
	Template string
	// Guest is what the agent said about itself when it became ready.
	Guest agent.GuestInfo

	vm          hypervisor.VM
	agent       *agent.Client
	stopTimeout time.Duration
	// checkpointing is held by the checkpoint being written: one at a
	// time, as each freezes and thaws the guest's filesystems.
	checkpointing sync.Mutex
	// spec is what the VM was launched with (without its restore
	// source); image the guest image. A checkpoint records both.
	spec  hypervisor.Spec
	image *image.Image

	// rootfs is Options.Rootfs.
	rootfs RootfsCache
	// containersDir holds the containers' scratch disks
	// (<data_dir>/containers/<namespace>/<id>).
	containersDir string
	// containers are the sandbox's containers (container.go).
	containers containers
	// calls are the container calls in flight (calls.go).
	calls callGate
	// life is the sandbox's phase (state.go).
	life *lifecycle
	// agentTimeout bounds each working call to the agent once the
	// sandbox is ready; a guest that does not answer in time is dead.
	agentTimeout time.Duration
	// watchDone is closed when the watch of the VM's end has returned;
	// stopped when Stop has finished. Both nil until Start made them.
	watchDone chan struct{}
	stopped   chan struct{}
	// stopErr is what the Stop that did the work returned; read after
	// stopped is closed.
	stopErr error

	// execUser is the sandbox's exec user configuration, which each
	// container's annotations may override (execuser.go).
	execUser config.ExecUser
	// startDeadline is when runtime.start_timeout, counted from the
	// launch, runs out: the first container's provisioning spends what
	// its boot left. created is set by the first CreateContainer.
	startDeadline time.Time
	created       atomic.Bool
	// host is what the sandbox keeps on the host besides its VM
	// (hostside.go).
	host hostSide
}

// Start launches a VM and returns once its agent is ready and the guest
// has its clock, entropy and hostname. On error nothing is left running
// and the state directory is gone.
func Start(ctx context.Context, o Options) (*Sandbox, error) {
	return start(ctx, o, nil)
}

// start is Start, or with r a restore from a checkpoint (restore.go).
func start(ctx context.Context, o Options, r *restoring) (_ *Sandbox, retErr error) {
	if err := ValidName("namespace", o.Namespace); err != nil {
		return nil, err
	}
	if err := ValidName("sandbox id", o.ID); err != nil {
		return nil, err
	}
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", o.ID))
	cfg := o.Config
	p, err := planLaunch(o)
	if err != nil {
		return nil, err
	}
	clone := o.Template
	if r != nil {
		clone = nil
	}
	log.G(ctx).WithField("accel", p.accel).WithField("accel_reason", p.accelWhy).
		WithField("channel", p.ch).WithField("channel_reason", p.chWhy).WithField("restore", r != nil).Info("starting sandbox")

	if err := o.Image.Verify(filepath.Join(cfg.Runtime.DataDir, "image")); err != nil {
		return nil, err
	}

	phase := PhaseBooting
	if r != nil || clone != nil {
		phase = PhaseRestoring
	}
	s := &Sandbox{
		Namespace: o.Namespace, ID: o.ID,
		Dir:   filepath.Join(cfg.Runtime.StateDir, o.Namespace, o.ID),
		Accel: p.accel, AccelReason: p.accelWhy, Channel: p.ch, ChannelReason: p.chWhy,
		stopTimeout:   cfg.Runtime.StopTimeout.Duration,
		agentTimeout:  cfg.Runtime.AgentTimeout.Duration,
		rootfs:        o.Rootfs,
		image:         o.Image,
		containersDir: filepath.Join(cfg.Runtime.DataDir, ContainersDirName, o.Namespace, o.ID),
		life:          newLifecycle(phase),
		watchDone:     make(chan struct{}),
		stopped:       make(chan struct{}),
	}
	s.spec = p.spec
	s.spec.StateDir = s.Dir
	began := time.Now()
	if r != nil {
		// Everything the checkpoint says is checked before anything is
		// made or launched.
		if err := r.verify(s); err != nil {
			return nil, err
		}
		r.took.verify = time.Since(began)
	}
	spare := o.spare
	if spare != nil {
		defer spare.close()
		err = takeSpareDir(ctx, o.Driver, spare, s.Dir)
	} else {
		err = makeStateDir(s.Dir)
	}
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox %s/%s: %w", o.Namespace, o.ID, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("sandbox state: %w", err)
	}
	defer func() {
		if retErr != nil {
			if s.host.beforeRan && o.UndoNetwork != nil {
				o.UndoNetwork(context.WithoutCancel(ctx), s.HookPID())
			}
			close(s.watchDone)
			_ = s.Stop(context.WithoutCancel(ctx))
		}
	}()
	if err := writeState(s.Dir, State{Namespace: o.Namespace, ID: o.ID, Driver: o.Driver.Name(), Created: time.Now().UTC()}); err != nil {
		return nil, err
	}

	startCtx, cancel := context.WithTimeout(ctx, cfg.Runtime.StartTimeout.Duration)
	defer cancel()
	s.execUser = cfg.ExecUser
	s.startDeadline, _ = startCtx.Deadline()
	spec := s.spec
	spec.Memory = o.memory
	if err := s.setUpHost(startCtx, o, &spec); err != nil {
		return nil, err
	}
	if clone != nil && spare == nil {
		if spec.Memory, spec.Restore, err = cloneFrom(clone); err != nil {
			return nil, err
		}
		defer spec.Restore.State.Close()
	}
	if r != nil {
		t := time.Now()
		if spec.Restore, err = r.prepare(startCtx, s); err != nil {
			return nil, err
		}
		defer spec.Restore.State.Close()
		r.took.prepare = time.Since(t)
	}
	// A restored guest on virtio-serial is resumed only once the host
	// is connected to the agent channel (connect), so that it finds a
	// host there, not an absent one whose EOFs would send its agent into
	// a backoff that the host's first HELLO then waits out. On vsock the
	// host's connect needs the guest running, and a restored guest's
	// vsock transport is reset (its new CID) as it resumes.
	resumeAfterDial := spec.Restore != nil && spec.Channel == channel.Serial
	if resumeAfterDial {
		spec.Restore.Resume = false
	}
	launched := time.Now()
	var parked net.Conn
	if spare != nil {
		// A spare is paused, parked in its handshake. On virtio-serial
		// it is resumed once the host holds its agent channel (the
		// parked connection), as a clone is; on vsock at once, since
		// the host's dial needs the guest running.
		s.vm, err = adoptSpare(startCtx, o.Driver, spare, s.Dir)
		resumeAfterDial, parked = spare.agent != nil, spare.agent
		spare.agent = nil
		if err == nil && parked == nil {
			err = resumeVM(startCtx, s.vm)
		}
	} else {
		s.vm, err = o.Driver.Launch(startCtx, spec)
	}
	if err != nil {
		if parked != nil {
			parked.Close()
		}
		return nil, fmt.Errorf("launch vm: %w", err)
	}
	connecting := time.Now()
	if err := s.connect(startCtx, resumeAfterDial, parked); err != nil {
		return nil, err
	}
	if n := s.host.net; n != nil && len(n.Config.Interfaces) > 0 {
		if err := s.agent.ConfigureNetwork(startCtx, n.Config); err != nil {
			return nil, err
		}
		log.G(ctx).WithField("netns", spec.NetNS).WithField("interfaces", len(n.Config.Interfaces)).
			WithField("routes", len(n.Config.Routes)).Info("guest network configured")
	}
	if r != nil {
		r.took.launch, r.took.connect = connecting.Sub(launched), time.Since(connecting)
		t := time.Now()
		if err := r.reattach(startCtx, s); err != nil {
			return nil, err
		}
		r.took.reattach = time.Since(t)
		log.G(ctx).WithFields(log.Fields{
			"verify_ms": r.took.verify.Milliseconds(), "prepare_ms": r.took.prepare.Milliseconds(),
			"launch_ms": r.took.launch.Milliseconds(), "connect_ms": r.took.connect.Milliseconds(),
			"reattach_ms": r.took.reattach.Milliseconds(), "total_ms": time.Since(began).Milliseconds(),
		}).Info("restore timing")
	}
	if err := s.life.to(PhaseReady); err != nil {
		return nil, err
	}
	s.ReadyIn = time.Since(launched)
	if clone != nil {
		s.Template = clone.Key()
	}
	s.agent.SetCallTimeout(s.agentTimeout, func(method string) {
		s.die(ctx, fmt.Errorf("the guest agent did not answer %s within %v", method, s.agentTimeout))
	})
	if o.unwatched {
		close(s.watchDone)
	} else {
		go s.watch(context.WithoutCancel(ctx))
	}
	log.G(ctx).WithField("ready_ms", s.ReadyIn.Milliseconds()).WithField("guest_kernel", s.Guest.KernelRelease).
		WithField("restored", r != nil).WithField("template", s.Template).Info("sandbox ready")
	return s, nil
}

// launchPlan is what start launches: the selected accelerator and
// channel, with the reasons, and the VM's spec without its state
// directory.
type launchPlan struct {
	accel           hypervisor.Accel
	accelWhy, chWhy string
	ch              channel.Kind
	spec            hypervisor.Spec
}

// planLaunch selects the accelerator and channel of o and builds the spec
// of its VM.
func planLaunch(o Options) (launchPlan, error) {
	cfg := o.Config
	var p launchPlan
	var err error
	if p.accel, p.accelWhy, err = hypervisor.SelectAccel(hypervisor.Accel(cfg.Hypervisor.Accel), o.AccelHost); err != nil {
		return p, err
	}
	if p.ch, p.chWhy, err = channel.Select(channel.Kind(cfg.Hypervisor.Channel), o.ChannelHost); err != nil {
		return p, err
	}
	if o.Image == nil {
		return p, fmt.Errorf("no guest image: %w", errdefs.ErrInvalidArgument)
	}
	p.spec = hypervisor.Spec{
		ID:              o.ID,
		Kernel:          o.Image.KernelPath(),
		Initrd:          o.Image.InitrdPath(),
		KernelArgs:      append(o.Image.KernelArgs(), cfg.Hypervisor.KernelArgs...),
		KernelHZ:        o.Image.Manifest.Kernel.HZ,
		VCPUs:           cfg.Hypervisor.VCPUs,
		MemoryMiB:       cfg.Hypervisor.MemoryMiB,
		Accel:           p.accel,
		Channel:         p.ch,
		ConsoleLogBytes: cfg.Runtime.ConsoleLogBytes,
	}
	return p, nil
}

// Agent is the client of the guest agent.
func (s *Sandbox) Agent() *agent.Client { return s.agent }

// VM is the running VM.
func (s *Sandbox) VM() hypervisor.VM { return s.vm }

// Stop ends the VM and removes the sandbox's state: QEMU is asked to quit
// (then SIGTERM, then SIGKILL), the containers' root filesystems are
// released and the state directory removed. It works in every phase, a
// dead sandbox's included. Safe to call more than once and concurrently:
// later calls wait for the first and return what it returned.
//
// The guest is not asked to shut down first. Nothing in it outlives the
// sandbox: the scratch disks go with their containers, so there is no
// cache to flush, and a guest power-off costs about 130 ms under TCG for
// nothing.
//
// Container calls in flight are let finish first, for up to the stop
// timeout; calls made after Stop began fail with errdefs.ErrUnavailable.
func (s *Sandbox) Stop(ctx context.Context) error {
	if !s.life.stop() {
		select {
		case <-s.stopped:
			return s.stopErr
		case <-ctx.Done():
			return fmt.Errorf("wait for the sandbox to stop: %w", ctx.Err())
		}
	}
	if n := s.calls.close(ctx, s.stopTimeout); n > 0 {
		log.G(ctx).WithField("calls", n).Warn("stopping the sandbox with container calls still in flight")
	}
	// A watch that found the VM dead is ending it; let it finish.
	<-s.watchDone
	s.stopErr = s.teardown(ctx)
	_ = s.life.to(PhaseStopped)
	close(s.stopped)
	return s.stopErr
}

// Phase returns the sandbox's phase and, for a dead sandbox, why it died.
func (s *Sandbox) Phase() (Phase, error) { return s.life.current() }

// Dead is closed when the VM has ended without Stop being asked, once it
// is gone: QEMU exited or was killed, or the guest was ended because it
// broke its session, sent garbage or stopped answering. Its processes are
// gone.
func (s *Sandbox) Dead() <-chan struct{} { return s.life.dead }

// watch waits for the VM to end, or its agent session to break, before
// Stop is called, and then declares the sandbox dead.
func (s *Sandbox) watch(ctx context.Context) {
	defer close(s.watchDone)
	var cause error
	select {
	case <-s.life.ended:
		return
	case <-s.vm.Exited():
		cause = s.vmEndCause()
	case <-s.agent.Done():
		// A VMM that exits closes the session too, often first: its exit
		// says more.
		select {
		case <-s.vm.Exited():
			cause = s.vmEndCause()
		case <-time.After(exitGrace):
			cause = errors.New("the guest agent's session ended (the guest closed it or sent what the host could not read)")
		}
	}
	s.die(ctx, cause)
}

// die declares a live sandbox dead: the agent session is closed, so that
// every call and wait in flight ends, and the VM is ended at once, since
// its guest can no longer be reached or trusted. Stop then releases what
// is left. A sandbox that is not live (booting, dead or stopping) is left
// to whoever is dealing with it.
func (s *Sandbox) die(ctx context.Context, cause error) {
	if !s.life.die(cause) {
		return
	}
	log.G(ctx).WithError(cause).Error("the sandbox's VM died; its processes are reported killed" + s.consoleTail())
	s.agent.Close()
	sctx, cancel := context.WithTimeout(ctx, deadStopTimeout)
	defer cancel()
	if err := s.vm.Stop(sctx); err != nil {
		log.G(ctx).WithError(err).Error("end the VM of a dead sandbox")
	}
	s.life.buried()
}

// vmEndCause describes a VM that ended while the sandbox was live.
func (s *Sandbox) vmEndCause() error {
	if err := s.vm.ExitError(); err != nil {
		return err
	}
	return fmt.Errorf("%w: the guest shut down or reset", hypervisor.ErrVMExited)
}

// teardown stops the VMM and removes what the sandbox made, whatever state
// it is in.
func (s *Sandbox) teardown(ctx context.Context) error {
	var errs []error
	if s.agent != nil {
		s.agent.Close()
	}
	if s.vm != nil {
		sctx, cancel := context.WithTimeout(ctx, s.stopTimeout)
		if err := s.vm.Stop(sctx); err != nil {
			errs = append(errs, fmt.Errorf("stop vm: %w", err))
		}
		cancel()
	}
	// After the VM stopped: the taps and the share are no longer in use.
	if err := s.closeHost(); err != nil {
		errs = append(errs, err)
	}
	// After the VM stopped: the scratch disks are no longer in use.
	if err := s.closeContainers(ctx); err != nil {
		errs = append(errs, fmt.Errorf("release containers: %w", err))
	}
	if err := share.RemoveAll(s.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove sandbox state: %w", err))
	}
	// The namespace directories go with their last sandbox. Remove fails
	// while another sandbox of the namespace exists, as it should.
	_ = os.Remove(filepath.Dir(s.Dir))
	if s.containersDir != "" {
		_ = os.Remove(filepath.Dir(s.containersDir))
	}
	return errors.Join(errs...)
}

// makeStateDir makes a sandbox's state directory, failing with ErrExist if
// it is there. The namespace directory above it is removed with the last
// sandbox of the namespace, possibly between our MkdirAll and Mkdir: then
// it is made again.
func makeStateDir(dir string) error {
	for try := 0; ; try++ {
		if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
			return err
		}
		err := os.Mkdir(dir, 0o700)
		if err == nil || !errors.Is(err, os.ErrNotExist) || try == 2 {
			return err
		}
	}
}

func writeState(dir string, st State) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, StateFile), data, 0o600); err != nil {
		return fmt.Errorf("sandbox state: %w", err)
	}
	return nil
}

// ReadState reads the record of the sandbox whose state directory is dir.
func ReadState(dir string) (State, error) {
	var st State
	data, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return st, fmt.Errorf("sandbox state: %w", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("sandbox state %s: %w: %v", dir, errdefs.ErrDataLoss, err)
	}
	return st, nil
}
