package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestDefaultIsValidAndRoundTrips(t *testing.T) {
	d := Default()
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	b, err := d.TOML()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Load(p, env(nil))
	if err != nil {
		t.Fatalf("load printed defaults: %v\n%s", err, b)
	}
	if got.Runtime.StartTimeout != d.Runtime.StartTimeout || got.Hypervisor.MemoryMiB != d.Hypervisor.MemoryMiB {
		t.Fatalf("round trip changed values: %+v", got)
	}
}

func TestLoadPrecedence(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(p, []byte("[hypervisor]\nvcpus = 2\naccel = \"kvm\"\n[runtime]\nstart_timeout = \"7s\"\n"), 0o644)
	c, err := Load("", env(map[string]string{"COCOON_CONFIG": p, "COCOON_ACCEL": "tcg"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Hypervisor.VCPUs != 2 {
		t.Errorf("file did not set vcpus: %d", c.Hypervisor.VCPUs)
	}
	if c.Hypervisor.Accel != "tcg" {
		t.Errorf("environment did not override the file: accel %q", c.Hypervisor.Accel)
	}
	if c.Runtime.StartTimeout.Duration != 7*time.Second {
		t.Errorf("start_timeout = %v", c.Runtime.StartTimeout)
	}
	if c.Hypervisor.MemoryMiB != 256 {
		t.Errorf("default memory lost: %d", c.Hypervisor.MemoryMiB)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	cases := []struct {
		name string
		path string
		env  map[string]string
		want string
	}{
		{"unknown key", write("a.toml", "[hypervisor]\nvcpu = 2\n"), nil, `unknown key "hypervisor.vcpu"`},
		{"bad toml", write("b.toml", "[hypervisor\n"), nil, "b.toml"},
		{"bad duration", write("c.toml", "[runtime]\nstart_timeout = \"soon\"\n"), nil, "c.toml"},
		{"explicit missing file", filepath.Join(dir, "none.toml"), nil, "none.toml"},
		{"bad env number", "", map[string]string{"COCOON_VCPUS": "many"}, "COCOON_VCPUS"},
		{"bad env bool", "", map[string]string{"COCOON_TEMPLATE_SPARE": "maybe"}, "COCOON_TEMPLATE_SPARE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.path, env(tc.env))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	// A missing default file is fine: every default is compiled in.
	if _, err := Load("", env(map[string]string{})); err != nil && !strings.Contains(err.Error(), DefaultPath) {
		t.Fatalf("missing default file: %v", err)
	}
}

func TestValidate(t *testing.T) {
	c := Default()
	c.Hypervisor.Accel = "fast"
	c.Hypervisor.VCPUs = 0
	c.Hypervisor.MemoryMiB = 1
	err := c.Validate()
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("err = %v, want invalid argument", err)
	}
	for _, want := range []string{"hypervisor.accel", "hypervisor.vcpus", "hypervisor.memory_mib"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

// TestVirtiofsd: the file server has a default, the file sets it, and a
// relative path is refused.
func TestVirtiofsd(t *testing.T) {
	if got := Default().Hypervisor.Virtiofsd; got != "/usr/lib/qemu/virtiofsd" {
		t.Errorf("default virtiofsd %q", got)
	}
	p := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(p, []byte("[hypervisor]\nvirtiofsd = \"/opt/qemu/libexec/virtiofsd\"\n"), 0o644)
	c, err := Load(p, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Hypervisor.Virtiofsd != "/opt/qemu/libexec/virtiofsd" {
		t.Errorf("file did not set virtiofsd: %q", c.Hypervisor.Virtiofsd)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("absolute virtiofsd: %v", err)
	}
	for _, v := range []string{"", "virtiofsd"} {
		c.Hypervisor.Virtiofsd = v
		if err := c.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "hypervisor.virtiofsd") {
			t.Errorf("virtiofsd %q: %v", v, err)
		}
	}
}

func TestValidateCopyBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Rootfs)
		want string
	}{
		{"bound too small", func(r *Rootfs) { r.CopyBackMaxBytes = 4096 }, "rootfs.copy_back_max_bytes"},
		{"no timeout", func(r *Rootfs) { r.CopyBackTimeout.Duration = 0 }, "rootfs.copy_back_timeout"},
		{"negative rate", func(r *Rootfs) { r.CopyBackBytesPerSecond = -1 }, "rootfs.copy_back_bytes_per_second"},
		// 11 GiB at 1 MiB/s takes three hours, past the 5 minutes.
		{"rate too slow for the bound", func(r *Rootfs) { r.CopyBackBytesPerSecond = 1 << 20 }, "longer than rootfs.copy_back_timeout"},
	} {
		c := Default()
		tc.set(&c.Rootfs)
		if err := c.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an invalid argument naming %s", tc.name, err, tc.want)
		}
	}
	c := Default()
	c.Rootfs.CopyBackBytesPerSecond = 100 << 20
	if err := c.Validate(); err != nil {
		t.Errorf("11 GiB at 100 MiB/s within 5 minutes: %v", err)
	}
}

func TestValidateExecUser(t *testing.T) {
	c := Default()
	if c.ExecUser.User != "" {
		t.Fatalf("the exec user is on by default: %q", c.ExecUser.User)
	}
	c.ExecUser.User = "dev:4242:4242:/home/dev:/bin/bash"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		user    string
		timeout time.Duration
		want    string
	}{
		{"dev:4242", 5 * time.Second, "exec_user.user"},
		{"dev:4242:99999999999", 5 * time.Second, "exec_user.user"},
		{"dev:4242:4242:/home/dev:bash", 5 * time.Second, "exec_user.user"},
		{"dev:4242:4242", time.Millisecond, "exec_user.timeout"},
		{"dev:4242:4242", time.Hour, "exec_user.timeout"},
	} {
		c := Default()
		c.ExecUser.User, c.ExecUser.Timeout.Duration = tc.user, tc.timeout
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("user %q, timeout %v: err = %v, want one naming %s", tc.user, tc.timeout, err, tc.want)
		}
	}
	// From the file, and COCOON_EXEC_USER over it.
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("[exec_user]\nuser = \"ops:5000:5000\"\nsudo = true\ntimeout = \"2s\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path, func(k string) string {
		if k == "COCOON_EXEC_USER" {
			return "dev:4242:4242"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.ExecUser.User != "dev:4242:4242" || !got.ExecUser.Sudo || got.ExecUser.Timeout.Duration != 2*time.Second {
		t.Errorf("loaded %+v", got.ExecUser)
	}
}

func TestTemplateSpareSetting(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.toml")
	if err := os.WriteFile(p, []byte("[template]\nspare = false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p, env(map[string]string{}))
	if err != nil || c.Template.Spare {
		t.Fatalf("spare = false in the file: spare %v, %v", c.Template.Spare, err)
	}
	c, err = Load(p, env(map[string]string{"COCOON_TEMPLATE_SPARE": "true"}))
	if err != nil || !c.Template.Spare {
		t.Fatalf("COCOON_TEMPLATE_SPARE=true over the file: spare %v, %v", c.Template.Spare, err)
	}
}
