package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/guest/api"
	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// TemplateNamespace is the namespace of the sandboxes that templates are
// made from; their ids are "template-<key>".
const TemplateNamespace = "cocoon.templates"

// templateSettle is how long a template's guest idles between its agent's
// first answer and the save, so that what the kernel and the agent do
// right after boot is done once, in the template, not in every clone.
const templateSettle = 500 * time.Millisecond

// ShapeOf is the shape of the VM that Start would launch for o: what
// keys its template.
func ShapeOf(o Options) (template.Shape, error) {
	switch {
	case o.NetNS != "" || o.NewNetNS:
		// Its NICs are known once its namespace is plumbed; a template
		// carrying NICs is not made yet (docs/networking.md).
		ns := o.NetNS
		if o.NewNetNS {
			ns = "of its own"
		}
		return template.Shape{}, fmt.Errorf("the sandbox mirrors network namespace %s, and templates with network interfaces are not made yet: %w", ns, errdefs.ErrNotImplemented)
	case o.Share:
		// vhost-user-fs cannot be saved (QEMU marks it unmigratable).
		return template.Shape{}, fmt.Errorf("the sandbox shares host directories (virtio-fs), which a template cannot carry: %w", errdefs.ErrNotImplemented)
	}
	p, err := planLaunch(o)
	if err != nil {
		return template.Shape{}, err
	}
	planner, ok := o.Driver.(hypervisor.Planner)
	if !ok {
		return template.Shape{}, fmt.Errorf("templates: the %s driver cannot plan a launch: %w", o.Driver.Name(), errdefs.ErrNotImplemented)
	}
	hp, err := planner.Plan(p.spec)
	if err != nil {
		return template.Shape{}, err
	}
	return template.Shape{
		Driver: hp.Driver, VMM: hp.VMM, VMMID: hp.VMMID,
		MachineType: hp.Type, Devices: hp.Devices,
		VCPUs: p.spec.VCPUs, MemoryMiB: p.spec.MemoryMiB,
		Accel: string(p.spec.Accel), Channel: string(p.spec.Channel),
		KernelArgs: p.spec.KernelArgs,
		Guest:      GuestImageOf(o.Image),
	}, nil
}

// MakeTemplate makes the template of o's shape in store: a sandbox of the
// shape is booted with its RAM in the template's memory file (shared),
// its agent waited for, left to settle, paused and saved, and stopped.
// What store.Create says of an existing template and of the lock holds.
func MakeTemplate(ctx context.Context, o Options, store *template.Store, co template.CreateOptions) (*template.Template, bool, error) {
	shape, err := ShapeOf(o)
	if err != nil {
		return nil, false, err
	}
	key := shape.Key()
	return store.Create(ctx, shape, co, func(ctx context.Context, b template.Build) (template.Built, error) {
		var built template.Built
		bo := o
		bo.Namespace, bo.ID, bo.Template = TemplateNamespace, "template-"+key, nil
		bo.memory = &hypervisor.MemoryFile{Path: b.Memory, Shared: true}
		// Its agent session is ended before the save.
		bo.unwatched = true
		sb, err := Start(ctx, bo)
		if err != nil {
			return built, fmt.Errorf("boot the template's guest: %w", err)
		}
		defer func() {
			if err := sb.Stop(context.WithoutCancel(ctx)); err != nil {
				log.G(ctx).WithError(err).Warn("stop the template's guest")
			}
		}()
		built.Boot = sb.ReadyIn
		// The agent session ends before the save, so that a clone's
		// agent waits in its handshake for the clone's host instead
		// of resuming in a session it must first find broken.
		raw, err := sb.parkAgent(ctx)
		if err != nil {
			return built, fmt.Errorf("the template's guest: %w", err)
		}
		if raw != nil {
			defer raw.Close()
		}
		select {
		case <-time.After(templateSettle):
		case <-ctx.Done():
			return built, ctx.Err()
		case <-sb.vm.Exited():
			return built, fmt.Errorf("the template's guest exited before it was saved: %w", hypervisor.ErrVMExited)
		}
		began := time.Now()
		if err := sb.saveTemplate(ctx, b.State); err != nil {
			return built, err
		}
		built.Save = time.Since(began)
		built.Machine = sb.machine()
		log.G(ctx).WithFields(log.Fields{"key": key, "boot_ms": built.Boot.Milliseconds(), "save_ms": built.Save.Milliseconds()}).Info("template saved")
		return built, nil
	})
}

// saveTemplate pauses the VM and saves its state (its RAM is the shared
// memory file) to path. The VM stays paused: it is stopped next.
func (s *Sandbox) saveTemplate(ctx context.Context, path string) error {
	snap, ok := s.vm.(hypervisor.Snapshotter)
	if !ok {
		return fmt.Errorf("templates: the hypervisor driver cannot save a VM: %w", errdefs.ErrNotImplemented)
	}
	if err := s.life.to(PhasePaused); err != nil {
		return err
	}
	if err := snap.Pause(ctx); err != nil {
		return fmt.Errorf("pause the template's VM: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := s.life.to(PhaseSaving); err != nil {
		return err
	}
	_, err = snap.Save(ctx, f)
	if perr := s.life.to(PhasePaused); err == nil {
		err = perr
	}
	if err != nil {
		return fmt.Errorf("save the template's VM: %w", err)
	}
	return f.Sync()
}

// cloneFrom is what Launch needs to start the VM from template t: its
// memory file mapped privately and its state, loaded and resumed. The
// VMM is checked to be the machine the template was saved from before
// anything is loaded.
func cloneFrom(t *template.Template) (*hypervisor.MemoryFile, *hypervisor.Restore, error) {
	state, err := t.OpenState()
	if err != nil {
		return nil, nil, err
	}
	want := t.Manifest.Machine
	return &hypervisor.MemoryFile{Path: t.MemoryPath()}, &hypervisor.Restore{
		State:  state,
		Resume: true,
		Check: func(hm hypervisor.Machine) error {
			if hm.Driver != want.Driver || hm.Version != want.DriverVersion || hm.Type != want.MachineType || !slices.Equal(hm.Devices, want.Devices) {
				return fmt.Errorf("template %s was saved by %s %s (%s, devices %q), this VMM is %s %s (%s, devices %q): %w",
					t.Key(), want.Driver, want.DriverVersion, want.MachineType, want.Devices, hm.Driver, hm.Version, hm.Type, hm.Devices, template.ErrStale)
			}
			return nil
		},
	}, nil
}

// TemplateUse says how StartWithTemplate started a sandbox.
type TemplateUse struct {
	// Mode is the template mode it followed.
	Mode string
	// Key is the key of the sandbox's shape.
	Key string
	// Used says the VM started from the template; otherwise it booted,
	// and Why says why. Spare says it started from the template's spare:
	// a clone made ahead of need and taken over.
	Used  bool
	Spare bool
	Why   string
	// Missing says that no valid template of the shape exists: in auto
	// mode the caller makes one in the background.
	Missing bool
}

// StartWithTemplate starts a sandbox the way o.Config.Template.Mode says:
// never boots; auto starts from the valid template of the sandbox's shape
// in store if there is one and boots otherwise (also when the start from
// the template fails on the template's account: a state the VMM refuses,
// a VMM that is not the template's); required starts from the template or
// fails, naming the shape's key. A template that is there but stale or
// corrupt is never loaded; the log says why it was passed over.
func StartWithTemplate(ctx context.Context, o Options, store *template.Store) (*Sandbox, TemplateUse, error) {
	use := TemplateUse{Mode: o.Config.Template.Mode}
	o.Template = nil
	if use.Mode == config.TemplateNever {
		use.Why = "template.mode is never"
		sb, err := Start(ctx, o)
		return sb, use, err
	}
	lg := log.G(ctx).WithField("sandbox", o.ID)
	shape, err := ShapeOf(o)
	if err != nil {
		if use.Mode == config.TemplateRequired {
			return nil, use, fmt.Errorf("template.mode is required: %w", err)
		}
		use.Why = err.Error()
		lg.WithError(err).Warn("no template can serve this sandbox; booting")
		sb, err := Start(ctx, o)
		return sb, use, err
	}
	use.Key = shape.Key()
	t, err := store.Lookup(shape)
	switch {
	case err == nil:
		o.Template = t
		if sb, ok := startFromSpare(ctx, o, use.Key); ok {
			use.Used, use.Spare = true, true
			return sb, use, nil
		}
		sb, err := Start(ctx, o)
		if err == nil {
			use.Used = true
			return sb, use, nil
		}
		if use.Mode == config.TemplateRequired || !errors.Is(err, template.ErrStale) && !errdefs.IsInvalidArgument(err) {
			return nil, use, fmt.Errorf("start from template %s: %w", use.Key, err)
		}
		use.Why, use.Missing = fmt.Sprintf("the start from template %s failed: %v", use.Key, err), true
		// Its files are sound but this host cannot start it (another
		// VMM build, a state QEMU refuses): it is removed, so that the
		// next creation makes one that can start, rather than every
		// start trying it again.
		if rerr := store.Remove(use.Key); rerr != nil {
			lg.WithError(rerr).Warn("remove a template that cannot start on this host")
		} else {
			lg.WithField("key", use.Key).Warn("removed a template that cannot start on this host")
		}
	case errdefs.IsNotFound(err):
		use.Why, use.Missing = fmt.Sprintf("no template of this shape (key %s) yet", use.Key), true
	default:
		use.Why, use.Missing = err.Error(), true
	}
	if use.Mode == config.TemplateRequired {
		return nil, use, fmt.Errorf("template.mode is required, and %s; `cocoon template create` makes it: %w", use.Why, errdefs.ErrFailedPrecondition)
	}
	lg.WithField("key", use.Key).WithField("reason", use.Why).Info("booting the sandbox: no template to start it from")
	o.Template = nil
	sb, err := Start(ctx, o)
	return sb, use, err
}

// startFromSpare starts the sandbox of o (whose Template is set) from the
// spare of key if one waits and template.spare is on. A spare that cannot
// be claimed or taken over is passed over with a log line (its VM is
// ended), and the caller starts a clone as it would without one.
func startFromSpare(ctx context.Context, o Options, key string) (*Sandbox, bool) {
	if !o.Config.Template.Spare {
		return nil, false
	}
	lg := log.G(ctx).WithField("sandbox", o.ID).WithField("key", key)
	c, err := claimSpare(ctx, o.Config.Runtime.StateDir, key)
	if err != nil {
		lg.WithError(err).Warn("passing over the spare of this shape")
		return nil, false
	}
	if c == nil {
		lg.Debug("no spare of this shape waits")
		return nil, false
	}
	o.spare = c
	sb, err := Start(ctx, o)
	if err != nil {
		lg.WithError(err).Warn("the start from the spare of this shape failed; starting a clone")
		return nil, false
	}
	return sb, true
}

// parkAgent ends the agent session and leaves the agent waiting in its
// handshake, where the next host's HELLO finds it. On virtio-serial the
// port is connected again at once (a host that is gone reads as EOF,
// which the agent would wait out in backoff) and the handshake is taken
// to its WELCOME; that connection is returned, the caller's to keep open
// while the guest is to stay parked. On vsock the agent goes back to
// accepting connections, and nil is returned.
func (s *Sandbox) parkAgent(ctx context.Context) (net.Conn, error) {
	s.agent.Close()
	if s.Channel != channel.Serial {
		return nil, nil
	}
	raw, err := s.vm.AgentEndpoint().Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("reconnect the agent channel: %w", err)
	}
	if err := api.HostPark(ctx, raw); err != nil {
		raw.Close()
		return nil, fmt.Errorf("park the agent: %w", err)
	}
	return raw, nil
}
