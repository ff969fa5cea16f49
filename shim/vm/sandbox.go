package vm

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/hostcgroup"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu"
	"github.com/cocoonrt/cocoon/runtime/image"
	"github.com/cocoonrt/cocoon/runtime/rootfs"
	"github.com/cocoonrt/cocoon/runtime/sandbox"
	"github.com/cocoonrt/cocoon/runtime/template"
	"github.com/cocoonrt/cocoon/shim/task"
)

// Launcher boots sandboxes with QEMU, configured by LoadConfig.
type Launcher struct {
	// Getenv reads the environment (the COCOON_* overrides).
	Getenv func(string) string
}

var _ task.Launcher = Launcher{}

// HostOverheadMiB is what a VM costs the host besides its guest's
// memory: QEMU's own memory (about 37 MiB, docs/performance.md), the
// shim's (about 17 MiB), virtiofsd's, and the page cache of the files
// they read and write that is charged to them. A pod's cgroup on the
// host is bounded to the guest's memory plus this
// (docs/kubernetes.md); the RuntimeClass's overhead says the same.
const HostOverheadMiB = 128

// Launch boots the sandbox r names. A pod's sandbox joins the pod's
// cgroup on the host first (r.CgroupsPath), so that what it starts is
// in it, bounded to the VM's size and HostOverheadMiB.
func (l Launcher) Launch(ctx context.Context, r task.LaunchRequest) (_ task.Sandbox, retErr error) {
	o, err := l.options(r)
	if err != nil {
		return nil, err
	}
	var group *hostcgroup.Group
	if r.CgroupsPath != "" {
		limits := hostcgroup.LimitsForVM(o.Config.Hypervisor.MemoryMiB, o.Config.Hypervisor.VCPUs, HostOverheadMiB)
		if group, err = hostcgroup.Join(r.CgroupsPath, limits); err != nil {
			return nil, fmt.Errorf("the pod's cgroup on the host: %w", err)
		}
		log.G(ctx).WithFields(log.Fields{"cgroup": group.Path(), "memory_bytes": group.Limits().MemoryBytes, "cpu_quota": group.Limits().CPUQuota}).Info("shim joined the pod's cgroup")
		defer func() {
			if retErr != nil {
				leaveCgroup(ctx, group)
			}
		}()
	}
	if group != nil {
		// A spare's QEMU is in the cgroup of the shim that made it, not
		// this pod's.
		o.Config.Template.Spare = false
	}
	store := template.Open(o.Config.Runtime.DataDir)
	sb, use, err := sandbox.StartWithTemplate(ctx, o, store)
	if err != nil {
		return nil, err
	}
	lg := log.G(ctx).WithFields(log.Fields{"sandbox": r.ID, "template_mode": use.Mode, "key": use.Key, "ready_ms": sb.ReadyIn.Milliseconds()})
	if use.Used {
		lg.WithField("spare", use.Spare).Info("sandbox started from template")
		if o.Config.Template.Spare {
			l.makeSpare(ctx, store, r, o.Config.Runtime.StateDir, use.Key)
		}
	} else {
		lg.WithField("reason", use.Why).Info("sandbox booted")
		if use.Missing && use.Mode == config.TemplateAuto {
			l.makeTemplate(ctx, store, r, use.Key)
		}
	}
	v := newVMSandbox(sb)
	v.cgroup = group
	return v, nil
}

// leaveCgroup moves the shim out of group and removes it, logging what
// keeps it.
func leaveCgroup(ctx context.Context, group *hostcgroup.Group) {
	if err := group.Leave(); err != nil {
		log.G(ctx).WithError(err).Warn("leave the pod's cgroup")
	}
}

// Restore brings the sandbox r names back from the checkpoint in dir,
// with c as the checkpoint's container.
func (l Launcher) Restore(ctx context.Context, r task.LaunchRequest, dir string, c task.ContainerSpec) (task.Sandbox, task.Process, error) {
	o, err := l.options(r)
	if err != nil {
		return nil, nil, err
	}
	allow, err := oci.AllowOtherNamespace(r.Annotations)
	if err != nil {
		return nil, nil, err
	}
	sb, init, err := sandbox.Restore(ctx, o, sandbox.RestoreOptions{
		Dir:                 dir,
		AllowOtherNamespace: allow,
		Container: sandbox.ContainerSpec{
			ID: c.ID, Spec: c.Spec, Rootfs: c.Rootfs, Stdin: c.Stdin, Stdout: c.Stdout, Stderr: c.Stderr,
		},
	})
	if err != nil {
		return nil, nil, err
	}
	return newVMSandbox(sb), init, nil
}

// options are the sandbox options of r: its configuration (defaults,
// config file, runtime options, annotations), the guest image and the
// layer cache.
func (l Launcher) options(r task.LaunchRequest) (sandbox.Options, error) {
	cfg, err := LoadConfig(r.Options, r.Annotations, l.Getenv)
	if err != nil {
		return sandbox.Options{}, err
	}
	if cfg, err = oci.SizeForResources(cfg, r.Annotations, r.Resources); err != nil {
		return sandbox.Options{}, err
	}
	img, err := image.Open(cfg.Guest.ImageDir)
	if err != nil {
		return sandbox.Options{}, err
	}
	layers, err := rootfs.Open(filepath.Join(cfg.Runtime.DataDir, rootfs.CacheDirName), rootfs.WithCopyBackLimits(rootfs.CopyBackLimits{
		MaxBytes:       cfg.Rootfs.CopyBackMaxBytes,
		Timeout:        cfg.Rootfs.CopyBackTimeout.Duration,
		BytesPerSecond: cfg.Rootfs.CopyBackBytesPerSecond,
	}))
	if err != nil {
		return sandbox.Options{}, err
	}
	return sandbox.Options{
		Namespace:     r.Namespace,
		ID:            r.ID,
		NetNS:         r.NetNS,
		NewNetNS:      r.NewNetNS,
		SpareNICs:     r.SpareNICs,
		HoldNetNS:     r.HoldNetNS,
		BeforeNetwork: r.BeforeNetwork,
		UndoNetwork:   r.UndoNetwork,
		Share:         r.Share,
		Config:        cfg,
		Driver:        qemu.New(qemu.Config{Binary: cfg.Hypervisor.Path, Virtiofsd: cfg.Hypervisor.Virtiofsd}),
		Image:         img,
		AccelHost:     hypervisor.LocalAccelHost(),
		ChannelHost:   channel.LocalHost(),
		Rootfs:        layers,
	}, nil
}

// vmSandbox adapts *sandbox.Sandbox to task.Sandbox.
type vmSandbox struct {
	*sandbox.Sandbox
	// events carries the sandbox's events as task events; closed with
	// the sandbox's channel.
	events chan task.SandboxEvent
	// cgroup is the pod's cgroup the shim joined for the VM; nil for
	// none. The first Stop that stopped the VM leaves it.
	cgroup *hostcgroup.Group
	left   sync.Once
}

// Stop stops the VM, then leaves the pod's cgroup, which nothing of the
// VM's holds any more.
func (v *vmSandbox) Stop(ctx context.Context) error {
	err := v.Sandbox.Stop(ctx)
	if v.cgroup != nil && err == nil {
		v.left.Do(func() { leaveCgroup(ctx, v.cgroup) })
	}
	return err
}

func newVMSandbox(sb *sandbox.Sandbox) *vmSandbox {
	v := &vmSandbox{Sandbox: sb, events: make(chan task.SandboxEvent)}
	go func() {
		defer close(v.events)
		for ev := range sb.Events() {
			if ev.Kind == sandbox.EventOOM {
				v.events <- task.SandboxEvent{Kind: task.EventOOM, ContainerID: ev.ContainerID, OOMKills: ev.OOMKills}
			}
		}
	}()
	return v
}

// GuestTime is the time spent in the guest agent's working calls.
func (v *vmSandbox) GuestTime() time.Duration {
	if a := v.Agent(); a != nil {
		return a.GuestTime()
	}
	return 0
}

// HostPID is the VMM's pid.
func (v *vmSandbox) HostPID() uint32 {
	if vm := v.VM(); vm != nil {
		return uint32(vm.PID())
	}
	return 0
}

// CreateContainer creates a container in the guest.
func (v *vmSandbox) CreateContainer(ctx context.Context, c task.ContainerSpec) (task.Process, error) {
	p, err := v.Sandbox.CreateContainer(ctx, sandbox.ContainerSpec{
		ID: c.ID, Spec: c.Spec, Rootfs: c.Rootfs, Stdin: c.Stdin, Stdout: c.Stdout, Stderr: c.Stderr,
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// ExecProcess starts a process in a container.
func (v *vmSandbox) ExecProcess(ctx context.Context, containerID, execID string, p *specs.Process, stdin io.Reader, stdout, stderr io.Writer) (task.Process, error) {
	proc, err := v.Sandbox.ExecProcess(ctx, containerID, execID, p, stdin, stdout, stderr)
	if err != nil {
		return nil, err
	}
	return proc, nil
}

// Checkpoint saves the sandbox's VM.
func (v *vmSandbox) Checkpoint(ctx context.Context, r task.CheckpointRequest) error {
	_, err := v.Sandbox.Checkpoint(ctx, sandbox.CheckpointOptions{
		Dir: r.Dir, ContainerID: r.ContainerID, Exit: r.Exit, Paused: r.Paused, Namespace: r.Namespace,
	})
	return err
}

// Events are the sandbox's events.
func (v *vmSandbox) Events() <-chan task.SandboxEvent { return v.events }
