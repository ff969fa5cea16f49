package deploy

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonrt/cocoon/runtime/containerdconfig"
)

// The containerd binaries the installer is run against (only their
// `--version` and `config dump`; none is started).
var containerds = map[string]string{
	"1.6": "/usr/bin/containerd",
	"1.7": "/opt/cocoon-test/containerd-1.7/bin/containerd",
	"2.4": "/opt/cocoon-test/containerd-2.4/bin/containerd",
}

func containerdBinary(t *testing.T, name string) string {
	t.Helper()
	path := containerds[name]
	if _, err := os.Stat(path); err != nil {
		t.Skipf("containerd %s: %v (Debian's package has 1.6, `make test-deps` installs 1.7 and 2.4)", name, err)
	}
	return path
}

// onHost are options for an install on this host (HostRoot "/") that
// touches only a config file and a state directory of its own, with a
// restart command that does nothing.
func onHost(t *testing.T, bin string) Options {
	dir := t.TempDir()
	return Options{
		HostRoot: "/", ContainerdConfig: filepath.Join(dir, "config.toml"), StateDir: filepath.Join(dir, "state"),
		Restart: true, Host: CommandHost{ContainerdPath: bin, Restart: []string{"true"}},
	}
}

// TestInstallWithContainerd: install through the real containerd of
// each version (its version read, its default config edited, its dump
// checked), then uninstall back to the default's bytes.
func TestInstallWithContainerd(t *testing.T) {
	for _, name := range []string{"1.6", "1.7", "2.4"} {
		t.Run(name, func(t *testing.T) {
			bin := containerdBinary(t, name)
			o := onHost(t, bin)
			def, err := CommandHost{ContainerdPath: bin}.Containerd(context.Background(), "config", "default")
			if err != nil {
				t.Fatal(err)
			}
			write(t, o.ContainerdConfig, string(def), 0o644)
			var out bytes.Buffer
			if err := Install(context.Background(), o, &out); err != nil {
				t.Fatalf("Install: %v\n%s", err, out.String())
			}
			if !strings.Contains(out.String(), "containerd "+name+" reads the runtime cocoon") || !strings.Contains(out.String(), "restarted containerd") {
				t.Fatalf("Install said\n%s", out.String())
			}
			if err := Uninstall(context.Background(), o, &out); err != nil {
				t.Fatalf("Uninstall: %v\n%s", err, out.String())
			}
			if got, _ := os.ReadFile(o.ContainerdConfig); !bytes.Equal(got, def) {
				t.Fatalf("after uninstall the config is\n%s", got)
			}
			if _, err := os.Stat(o.StateDir); !os.IsNotExist(err) {
				t.Fatalf("the state directory is left: %v", err)
			}
		})
	}
}

// TestInstallHiddenByImport: on containerd 1.x an imported file of the
// node's own with a CRI table hides the appended handler; the dump shows
// it, and install puts the config back and fails, saying why.
func TestInstallHiddenByImport(t *testing.T) {
	for _, name := range []string{"1.6", "1.7"} {
		t.Run(name, func(t *testing.T) {
			o := onHost(t, containerdBinary(t, name))
			site := filepath.Join(filepath.Dir(o.ContainerdConfig), "site.toml")
			write(t, site, "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n", 0o644)
			const main = "version = 2\nimports = [\"site.toml\"]\n"
			write(t, o.ContainerdConfig, main, 0o644)
			var out bytes.Buffer
			err := Install(context.Background(), o, &out)
			if err == nil || !strings.Contains(err.Error(), "replaces that of the main file") {
				t.Fatalf("Install: %v\n%s", err, out.String())
			}
			if got, _ := os.ReadFile(o.ContainerdConfig); string(got) != main {
				t.Fatalf("the config is left as\n%s", got)
			}
			if strings.Contains(out.String(), "restarted") {
				t.Fatalf("containerd was restarted:\n%s", out.String())
			}
		})
	}
}

// TestInstallLeavesNodesHandler: a handler the node's own imported file
// defines is left as it is.
func TestInstallLeavesNodesHandler(t *testing.T) {
	o := onHost(t, containerdBinary(t, "2.4"))
	site := filepath.Join(filepath.Dir(o.ContainerdConfig), "site.toml")
	snippet, _ := containerdconfig.Snippet(3)
	write(t, site, snippet, 0o644)
	const main = "version = 3\nimports = [\"site.toml\"]\n"
	write(t, o.ContainerdConfig, main, 0o644)
	var out bytes.Buffer
	if err := Install(context.Background(), o, &out); err != nil || !strings.Contains(out.String(), "not from cocoon deploy: left as it is") {
		t.Fatalf("Install: %v\n%s", err, out.String())
	}
	if got, _ := os.ReadFile(o.ContainerdConfig); string(got) != main || strings.Contains(out.String(), "restarted") {
		t.Fatalf("the config became\n%s\n%s", got, out.String())
	}
}
