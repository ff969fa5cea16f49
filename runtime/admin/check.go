package admin

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/image"
	"github.com/cocoonrt/cocoon/runtime/network"
	"github.com/cocoonrt/cocoon/runtime/version"
)

// containerdSocket is where a system containerd listens.
const containerdSocket = "/run/containerd/containerd.sock"

// Check reports what this host offers Cocoon, then boots a throwaway VM to
// agent readiness. It returns an error unless the VM became ready; its last
// line of output is then `ready in <N> ms (<accel>, <channel>)`.
func (e *Env) Check(ctx context.Context, w io.Writer) error {
	cfg := e.Config
	fmt.Fprintf(w, "cocoon %s\n", version.Version)
	fmt.Fprintf(w, "config: %s\n", e.ConfigSource)

	qemuVersion, err := commandFirstLine(ctx, cfg.Hypervisor.Path, "--version")
	if err != nil {
		fmt.Fprintf(w, "qemu: %s: %v\n", cfg.Hypervisor.Path, err)
		return fmt.Errorf("qemu %s: %w", cfg.Hypervisor.Path, err)
	}
	fmt.Fprintf(w, "qemu: %s (%s)\n", cfg.Hypervisor.Path, qemuVersion)

	accel, why, err := hypervisor.SelectAccel(hypervisor.Accel(cfg.Hypervisor.Accel), e.AccelHost)
	if err != nil {
		fmt.Fprintf(w, "accel: %v\n", err)
		return err
	}
	fmt.Fprintf(w, "accel: %s (%s)\n", accel, why)
	ch, why, err := channel.Select(channel.Kind(cfg.Hypervisor.Channel), e.ChannelHost)
	if err != nil {
		fmt.Fprintf(w, "channel: %v\n", err)
		return err
	}
	fmt.Fprintf(w, "channel: %s (%s)\n", ch, why)

	img, err := image.Open(cfg.Guest.ImageDir)
	if err != nil {
		fmt.Fprintf(w, "guest image: %v\n", err)
		return err
	}
	m := img.Manifest
	fmt.Fprintf(w, "guest image: %s\n", img.Dir)
	fmt.Fprintf(w, "  kernel: %s %s sha256:%s\n", m.Kernel.Path, m.Kernel.Version, m.Kernel.SHA256)
	fmt.Fprintf(w, "  initrd: %s (%s) sha256:%s\n", m.Initrd.Path, orNone(m.Initrd.Compression), m.Initrd.SHA256)
	// Hash now, without the stamp, so check always says what is on disk.
	if err := img.Verify(""); err != nil {
		fmt.Fprintf(w, "  digests: %v\n", err)
		return err
	}
	fmt.Fprintf(w, "  digests: verified\n")

	fmt.Fprintf(w, "containerd: %s\n", containerdStatus(ctx))
	fmt.Fprintf(w, "containerd CRI: %s\n", criStatus(ctx, e.ContainerdConfig))
	fmt.Fprintf(w, "template: %s\n", e.templateStatus())
	fmt.Fprintf(w, "networking: %s\n", networkStatus(accel))
	fmt.Fprintf(w, "virtio-fs: %s\n", virtiofsStatus(ctx, cfg.Hypervisor.Virtiofsd))

	fmt.Fprintf(w, "booting a throwaway vm (%d vcpu, %d MiB)...\n", cfg.Hypervisor.VCPUs, cfg.Hypervisor.MemoryMiB)
	sb, err := e.StartSandbox(ctx, "check")
	if err != nil {
		fmt.Fprintf(w, "boot failed: %v\n", err)
		return err
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*cfg.Runtime.StopTimeout.Duration)
	defer cancel()
	if err := sb.Stop(stopCtx); err != nil {
		fmt.Fprintf(w, "stop failed: %v\n", err)
		return err
	}
	fmt.Fprintf(w, "guest: kernel %s, agent %s\n", sb.Guest.KernelRelease, sb.Guest.Version)
	fmt.Fprintf(w, "ready in %d ms (%s, %s)\n", sb.ReadyIn.Milliseconds(), sb.Accel, sb.Channel)
	return nil
}

// networkStatus says whether this host can give a VM the interfaces of
// a network namespace (network.Probe), and whether the NICs get
// vhost-net. Neither is needed to boot a VM, so it is reported, not
// required.
func networkStatus(accel hypervisor.Accel) string {
	s := "taps with tc redirects ok"
	if err := network.Probe(); err != nil {
		s = fmt.Sprintf("taps with tc redirects fail (%v): containers that join a network namespace cannot run", err)
	}
	switch {
	case accel != hypervisor.AccelKVM:
		return s + "; vhost-net not used under " + string(accel)
	default:
		f, err := os.OpenFile(network.VhostNetDevice, os.O_RDWR, 0)
		if err != nil {
			return fmt.Sprintf("%s; vhost-net not usable (%v): the NICs are slower without it", s, err)
		}
		f.Close()
		return s + "; vhost-net ok"
	}
}

// virtiofsStatus says whether the virtio-fs file server is there and
// runs. Only sandboxes that share host directories need it, so it is
// reported, not required.
func virtiofsStatus(ctx context.Context, path string) string {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return fmt.Sprintf("%s: %v: containers with bind mounts cannot run (apt-get install qemu-system-common)", path, err)
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		return fmt.Sprintf("%s is not an executable file: containers with bind mounts cannot run", path)
	}
	v, err := commandFirstLine(ctx, path, "--version")
	if err != nil {
		return fmt.Sprintf("%s does not run (%v): containers with bind mounts cannot run", path, err)
	}
	return fmt.Sprintf("%s ok (%s)", path, v)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// containerdStatus says which containerd is installed and whether one
// serves the default socket. Neither is needed to boot a VM, so it is
// reported, not required.
func containerdStatus(ctx context.Context) string {
	path, err := exec.LookPath("containerd")
	if err != nil {
		return "not installed (needed for the shim, not for this check)"
	}
	v, err := commandFirstLine(ctx, path, "--version")
	if err != nil {
		v = err.Error()
	}
	state := "not serving " + containerdSocket
	if c, err := net.DialTimeout("unix", containerdSocket, time.Second); err == nil {
		c.Close()
		state = "serving " + containerdSocket
	}
	return fmt.Sprintf("%s (%s), %s", path, v, state)
}

func commandFirstLine(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line, nil
}

// templateStatus says how sandboxes of the configured shape start: from
// which template, or why they boot.
func (e *Env) templateStatus() string {
	mode := e.Config.Template.Mode
	if mode == config.TemplateNever {
		return "mode never: sandboxes boot"
	}
	shape, err := e.CurrentShape()
	if err != nil {
		return fmt.Sprintf("mode %s: %v", mode, err)
	}
	t, err := e.Templates().Lookup(shape)
	switch {
	case err == nil:
		return fmt.Sprintf("mode %s: sandboxes of this shape start from %s", mode, t.Dir)
	case errdefs.IsNotFound(err):
		return fmt.Sprintf("mode %s: no template of this shape (key %s); `cocoon template create` makes it", mode, shape.Key())
	default:
		return fmt.Sprintf("mode %s: %v", mode, err)
	}
}
