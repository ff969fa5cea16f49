// Package config is Cocoon's one typed configuration.
//
// Precedence, highest first: pod/container annotations (io.cocoon.*, see
// package oci) > runtime options from containerd > environment
// (the COCOON_* variables EnvVars lists) > the file (/etc/cocoon/config.toml, or
// the path in COCOON_CONFIG) > the defaults compiled in (Default). Load
// applies file and environment; callers apply the layers above it and call
// Validate once at the end.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/execuser"
)

// DefaultPath is where the optional config file lives.
const DefaultPath = "/etc/cocoon/config.toml"

// Config is the whole configuration.
type Config struct {
	// Hypervisor says how guests are run.
	Hypervisor Hypervisor `toml:"hypervisor"`
	// Guest locates the guest image.
	Guest Guest `toml:"guest"`
	// Runtime holds host paths and time limits.
	Runtime Runtime `toml:"runtime"`
	// Rootfs bounds what comes back from containers' root filesystems.
	Rootfs Rootfs `toml:"rootfs"`
	// Template says whether sandboxes start from templates
	// (docs/templates.md).
	Template Template `toml:"template"`
	// ExecUser is a user provisioned in every container once the guest
	// is ready (docs/exec-user.md); off unless User is set.
	ExecUser ExecUser `toml:"exec_user"`
}

// ExecUser configures the exec user.
type ExecUser struct {
	// User is "name:uid:gid[:home[:shell]]"; empty: no user is
	// provisioned. Home defaults to /home/<name>, shell to /bin/sh.
	User string `toml:"user"`
	// Sudo gives the user passwordless sudo, in images that have sudo.
	Sudo bool `toml:"sudo"`
	// Required fails a container's create when the user cannot be
	// provisioned; otherwise that is a warning, and provisioning is
	// retried in the background a few times.
	Required bool `toml:"required"`
	// Timeout bounds one provisioning attempt.
	Timeout Duration `toml:"timeout"`
}

// Bounds of exec_user.timeout: provisioning edits three small files.
const (
	MinExecUserTimeout = 100 * time.Millisecond
	MaxExecUserTimeout = 5 * time.Minute
)

// Template modes.
const (
	// TemplateAuto starts a sandbox from the template of its shape if
	// there is a valid one, else boots it and makes the template in the
	// background.
	TemplateAuto = "auto"
	// TemplateNever always boots.
	TemplateNever = "never"
	// TemplateRequired starts from a template or fails.
	TemplateRequired = "required"
)

// Template configures templates.
type Template struct {
	// Mode is TemplateAuto, TemplateNever or TemplateRequired.
	Mode string `toml:"mode"`
	// Spare keeps one clone of a template restored and warmed ahead of
	// need, after a sandbox started from it, for the next sandbox of its
	// shape to take over (docs/templates.md).
	Spare bool `toml:"spare"`
}

// Hypervisor configures the VMM and the guest's shape.
type Hypervisor struct {
	// Driver is the VMM driver; "qemu" is the only one today.
	Driver string `toml:"driver"`
	// Path is the VMM binary.
	Path string `toml:"path"`
	// Virtiofsd is the virtio-fs file server that shares host
	// directories (containers' bind mounts) with a guest; only
	// sandboxes that share directories run it.
	Virtiofsd string `toml:"virtiofsd"`
	// Accel is "auto" (KVM when the host has hardware virtualization,
	// else TCG), "kvm" or "tcg".
	Accel string `toml:"accel"`
	// Channel is the agent transport: "auto" (vsock when /dev/vhost-vsock
	// is usable, else virtio-serial), "vsock" or "serial".
	Channel string `toml:"channel"`
	// VCPUs is the default number of guest vCPUs.
	VCPUs int `toml:"vcpus"`
	// MemoryMiB is the default guest memory in MiB.
	MemoryMiB int `toml:"memory_mib"`
	// KernelArgs are added to the guest kernel command line.
	KernelArgs []string `toml:"kernel_args"`
}

// Guest locates the guest image.
type Guest struct {
	// ImageDir holds the kernel, the initrd and manifest.json.
	ImageDir string `toml:"image_dir"`
}

// Runtime holds host paths and time limits.
type Runtime struct {
	// StateDir is the root of per-sandbox runtime state
	// (<state_dir>/<namespace>/<sandbox-id>/).
	StateDir string `toml:"state_dir"`
	// DataDir is the root of persistent state: layer cache, templates.
	DataDir string `toml:"data_dir"`
	// StartTimeout bounds a sandbox start, from VMM launch to agent ready.
	StartTimeout Duration `toml:"start_timeout"`
	// StopTimeout bounds how long QEMU has to quit before it is killed.
	StopTimeout Duration `toml:"stop_timeout"`
	// AgentTimeout bounds each call the guest agent works on (not the
	// waits for exits and events) once the sandbox is ready. A guest that
	// does not answer in time is declared dead and its VM ended.
	AgentTimeout Duration `toml:"agent_timeout"`
	// ConsoleLogBytes caps each sandbox's console.log.
	ConsoleLogBytes int64 `toml:"console_log_bytes"`
}

// Rootfs bounds the copy back of a container's writes: when its task is
// deleted the guest streams its writable layer to the host as a layer
// diff (docs/rootfs.md, docs/security.md).
type Rootfs struct {
	// CopyBackMaxBytes bounds the diff of one container; a larger one is
	// refused whole and the container's writes are lost, said in the
	// shim's log.
	CopyBackMaxBytes int64 `toml:"copy_back_max_bytes"`
	// CopyBackTimeout bounds one copy back, from the request to the
	// guest to the last entry applied, so that a slow or endless stream
	// cannot hold a delete.
	CopyBackTimeout Duration `toml:"copy_back_timeout"`
	// CopyBackBytesPerSecond caps how fast the host reads a diff (the
	// disk bandwidth one container's copy back takes); 0 is no cap.
	CopyBackBytesPerSecond int64 `toml:"copy_back_bytes_per_second"`
}

// MinCopyBackMaxBytes is the smallest copy back bound: a container's root
// directory alone takes a few KiB of tar headers.
const MinCopyBackMaxBytes = 1 << 20

// Duration is a time.Duration written as "30s" in TOML.
type Duration struct{ time.Duration }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalText writes a Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Limits on guest shape. QEMU's microvm takes more, but past these a
// microVM is the wrong tool and a typo is the likelier cause.
const (
	MaxVCPUs     = 64
	MinMemoryMiB = 64
	MaxMemoryMiB = 256 * 1024
)

// Default returns the compiled-in configuration.
func Default() Config {
	return Config{
		Hypervisor: Hypervisor{
			Driver:    "qemu",
			Path:      "/usr/bin/qemu-system-x86_64",
			Virtiofsd: "/usr/lib/qemu/virtiofsd",
			Accel:     "auto",
			Channel:   "auto",
			VCPUs:     1,
			MemoryMiB: 256,
		},
		Guest: Guest{ImageDir: "/usr/local/share/cocoon"},
		Runtime: Runtime{
			StateDir: "/run/cocoon",
			DataDir:  "/var/lib/cocoon",
			// Generous: a cold boot under TCG on a loaded 2-core host
			// takes seconds; under KVM it is a fraction of one.
			StartTimeout: Duration{30 * time.Second},
			StopTimeout:  Duration{5 * time.Second},
			// A working call takes well under a second even under TCG;
			// a minute without an answer is a guest that is gone.
			AgentTimeout:    Duration{60 * time.Second},
			ConsoleLogBytes: 1 << 20,
		},
		Template: Template{Mode: TemplateAuto, Spare: true},
		// A provisioning takes milliseconds; seconds are a guest in
		// trouble.
		ExecUser: ExecUser{Timeout: Duration{5 * time.Second}},
		Rootfs: Rootfs{
			// A full default scratch disk (10 GiB) and its tar headers,
			// at about 40 MB/s.
			CopyBackMaxBytes: 11 << 30,
			CopyBackTimeout:  Duration{5 * time.Minute},
		},
	}
}

// envOverrides lists the environment variables Load reads, each overriding
// one field. They serve tests, CI and one-off runs; the file is the place
// for lasting settings.
var envOverrides = [...]struct {
	Name string
	Doc  string
	set  func(*Config, string) error
}{
	{"COCOON_ACCEL", "hypervisor.accel", func(c *Config, v string) error { c.Hypervisor.Accel = v; return nil }},
	{"COCOON_TEMPLATE", "template.mode", func(c *Config, v string) error { c.Template.Mode = v; return nil }},
	{"COCOON_TEMPLATE_SPARE", "template.spare", func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false: %w", err)
		}
		c.Template.Spare = b
		return nil
	}},
	{"COCOON_EXEC_USER", "exec_user.user", func(c *Config, v string) error { c.ExecUser.User = v; return nil }},
	{"COCOON_CHANNEL", "hypervisor.channel", func(c *Config, v string) error { c.Hypervisor.Channel = v; return nil }},
	{"COCOON_QEMU", "hypervisor.path", func(c *Config, v string) error { c.Hypervisor.Path = v; return nil }},
	{"COCOON_IMAGE_DIR", "guest.image_dir", func(c *Config, v string) error { c.Guest.ImageDir = v; return nil }},
	{"COCOON_STATE_DIR", "runtime.state_dir", func(c *Config, v string) error { c.Runtime.StateDir = v; return nil }},
	{"COCOON_DATA_DIR", "runtime.data_dir", func(c *Config, v string) error { c.Runtime.DataDir = v; return nil }},
	{"COCOON_START_TIMEOUT", "runtime.start_timeout", func(c *Config, v string) error {
		return c.Runtime.StartTimeout.UnmarshalText([]byte(v))
	}},
	{"COCOON_AGENT_TIMEOUT", "runtime.agent_timeout", func(c *Config, v string) error {
		return c.Runtime.AgentTimeout.UnmarshalText([]byte(v))
	}},
	{"COCOON_VCPUS", "hypervisor.vcpus", func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		c.Hypervisor.VCPUs = n
		return err
	}},
	{"COCOON_MEMORY_MIB", "hypervisor.memory_mib", func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		c.Hypervisor.MemoryMiB = n
		return err
	}},
}

// Load returns the defaults overlaid with the file at path (if path is
// empty: COCOON_CONFIG, else DefaultPath; a missing default file is not an
// error) and then the environment. It does not validate: callers apply
// runtime options and annotations first.
func Load(path string, getenv func(string) string) (Config, error) {
	c := Default()
	explicit := path != ""
	if !explicit {
		if p := getenv("COCOON_CONFIG"); p != "" {
			path, explicit = p, true
		} else {
			path = DefaultPath
		}
	}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		md, err := toml.Decode(string(data), &c)
		if err != nil {
			return Config{}, fmt.Errorf("config %s: %w: %v", path, errdefs.ErrInvalidArgument, err)
		}
		if un := md.Undecoded(); len(un) > 0 {
			return Config{}, fmt.Errorf("config %s: %w: unknown key %q", path, errdefs.ErrInvalidArgument, un[0].String())
		}
	case errors.Is(err, os.ErrNotExist) && !explicit:
	default:
		return Config{}, fmt.Errorf("config: %w", err)
	}
	for _, e := range envOverrides {
		if v := getenv(e.Name); v != "" {
			if err := e.set(&c, v); err != nil {
				return Config{}, fmt.Errorf("%s=%q: %w: %v", e.Name, v, errdefs.ErrInvalidArgument, err)
			}
		}
	}
	return c, nil
}

// Validate checks the whole configuration once all layers are applied.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf(format, a...))
	}
	h := c.Hypervisor
	if h.Driver != "qemu" {
		bad("hypervisor.driver = %q: only \"qemu\" is supported", h.Driver)
	}
	if h.Path == "" {
		bad("hypervisor.path is empty")
	}
	if !filepath.IsAbs(h.Virtiofsd) {
		bad("hypervisor.virtiofsd = %q: want an absolute path", h.Virtiofsd)
	}
	switch h.Accel {
	case "auto", "kvm", "tcg":
	default:
		bad("hypervisor.accel = %q: want auto, kvm or tcg", h.Accel)
	}
	switch h.Channel {
	case "auto", "vsock", "serial":
	default:
		bad("hypervisor.channel = %q: want auto, vsock or serial", h.Channel)
	}
	if h.VCPUs < 1 || h.VCPUs > MaxVCPUs {
		bad("hypervisor.vcpus = %d: want 1 to %d", h.VCPUs, MaxVCPUs)
	}
	if h.MemoryMiB < MinMemoryMiB || h.MemoryMiB > MaxMemoryMiB {
		bad("hypervisor.memory_mib = %d: want %d to %d", h.MemoryMiB, MinMemoryMiB, MaxMemoryMiB)
	}
	if c.Guest.ImageDir == "" {
		bad("guest.image_dir is empty")
	}
	if c.Runtime.StateDir == "" || c.Runtime.DataDir == "" {
		bad("runtime.state_dir and runtime.data_dir must be set")
	}
	if c.Runtime.StartTimeout.Duration <= 0 {
		bad("runtime.start_timeout must be positive")
	}
	if c.Runtime.StopTimeout.Duration <= 0 {
		bad("runtime.stop_timeout must be positive")
	}
	if c.Runtime.AgentTimeout.Duration < time.Second {
		bad("runtime.agent_timeout = %v: want at least 1s", c.Runtime.AgentTimeout.Duration)
	}
	if c.Runtime.ConsoleLogBytes < 4096 {
		bad("runtime.console_log_bytes = %d: want at least 4096", c.Runtime.ConsoleLogBytes)
	}
	switch c.Template.Mode {
	case TemplateAuto, TemplateNever, TemplateRequired:
	default:
		bad("template.mode = %q: want auto, never or required", c.Template.Mode)
	}
	if u := c.ExecUser.User; u != "" {
		if _, err := execuser.Parse(u); err != nil {
			bad("exec_user.user: %v", err)
		}
	}
	if t := c.ExecUser.Timeout.Duration; t < MinExecUserTimeout || t > MaxExecUserTimeout {
		bad("exec_user.timeout = %v: want %v to %v", t, MinExecUserTimeout, MaxExecUserTimeout)
	}
	r := c.Rootfs
	if r.CopyBackMaxBytes < MinCopyBackMaxBytes {
		bad("rootfs.copy_back_max_bytes = %d: want at least %d", r.CopyBackMaxBytes, MinCopyBackMaxBytes)
	}
	if r.CopyBackTimeout.Duration < time.Second {
		bad("rootfs.copy_back_timeout = %v: want at least 1s", r.CopyBackTimeout.Duration)
	}
	if r.CopyBackBytesPerSecond < 0 {
		bad("rootfs.copy_back_bytes_per_second = %d: want 0 (no cap) or more", r.CopyBackBytesPerSecond)
	} else if r.CopyBackBytesPerSecond > 0 && r.CopyBackMaxBytes > 0 {
		if need := time.Duration(float64(r.CopyBackMaxBytes) / float64(r.CopyBackBytesPerSecond) * float64(time.Second)); need > r.CopyBackTimeout.Duration {
			bad("rootfs.copy_back_bytes_per_second = %d: a diff of rootfs.copy_back_max_bytes takes %v at that rate, longer than rootfs.copy_back_timeout (%v)",
				r.CopyBackBytesPerSecond, need.Round(time.Second), r.CopyBackTimeout.Duration)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, errors.Join(errs...))
	}
	return nil
}

// TOML renders c as a commented config file (what `cocoon config default`
// prints).
func (c Config) TOML() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString("# Cocoon configuration (" + DefaultPath + "). Every key is optional;\n")
	buf.WriteString("# the values below are the compiled-in defaults. See docs/configuration.md.\n\n")
	if err := toml.NewEncoder(&buf).Encode(c); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// EnvVars returns the environment variables Load reads, each with the key
// it overrides.
func EnvVars() [][2]string {
	out := make([][2]string, 0, len(envOverrides))
	for _, e := range envOverrides {
		out = append(out, [2]string{e.Name, e.Doc})
	}
	return out
}
