package admin

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/runtime/containerdconfig"
)

// TestCRILine: the check line says what a dump (containerd 1.x's form,
// 2.x's form) says of the handler.
func TestCRILine(t *testing.T) {
	v2, _ := containerdconfig.Snippet(2)
	v3, _ := containerdconfig.Snippet(3)
	v3 = strings.ReplaceAll(strings.ReplaceAll(v3, `"`, `'`), "version = 3", "version = 4")
	for _, tc := range []struct{ name, dump, want string }{
		{"1.x", v2, "handler cocoon configured (containerd 1.6, /etc/containerd/config.toml)"},
		{"2.x", v3, "handler cocoon configured (containerd 1.6, /etc/containerd/config.toml)"},
		{"none", "version = 2\n", "not configured: no runtime cocoon among the CRI runtimes (containerd 1.6, /etc/containerd/config.toml); `cocoon deploy install` adds it"},
		{"disabled", "version = 2\ndisabled_plugins = ['io.containerd.grpc.v1.cri']\n", `not configured: the CRI plugin is disabled (disabled_plugins has "io.containerd.grpc.v1.cri")`},
		{"wrong type", strings.Replace(v2, "io.containerd.cocoon.v2", "io.containerd.runc.v2", 1), `handler cocoon configured (containerd 1.6, /etc/containerd/config.toml), but its runtime_type is "io.containerd.runc.v2"`},
		{"not toml", "version = [", "not checked: containerd config dump: invalid argument"},
	} {
		if got := criLine([]byte(tc.dump), "containerd 1.6", "/etc/containerd/config.toml"); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %q, want it to start with %q", tc.name, got, tc.want)
		}
	}
}

// TestCRIStatus runs the check against the containerd on the PATH (1.6
// on this project's hosts): a config without the handler, one with it,
// one missing.
func TestCRIStatus(t *testing.T) {
	if _, err := exec.LookPath("containerd"); err != nil {
		t.Skip("containerd is not installed")
	}
	dir := t.TempDir()
	without, with := filepath.Join(dir, "without.toml"), filepath.Join(dir, "with.toml")
	v2, _ := containerdconfig.Snippet(2)
	os.WriteFile(without, []byte("version = 2\n"), 0o644)
	os.WriteFile(with, []byte(v2+"[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"), 0o644)
	ctx := context.Background()
	for path, want := range map[string]string{
		without:                         "not configured: no runtime cocoon among the CRI runtimes (containerd ",
		with:                            "handler cocoon configured (containerd ",
		filepath.Join(dir, "none.toml"): "not configured: " + filepath.Join(dir, "none.toml") + " does not exist",
	} {
		if got := criStatus(ctx, path); !strings.HasPrefix(got, want) || !strings.Contains(got, filepath.Base(path)) {
			t.Errorf("criStatus(%s) = %q, want it to start with %q", path, got, want)
		}
	}
}

// TestStaleNote: a config file changed after containerd started is said
// to need a restart.
func TestStaleNote(t *testing.T) {
	f := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(f, nil, 0o644)
	if got := staleNote(time.Now().Add(time.Minute), f, f+".missing"); got != "" {
		t.Errorf("a file older than containerd: %q", got)
	}
	if got := staleNote(time.Now().Add(-time.Minute), f); !strings.Contains(got, "restart it") {
		t.Errorf("a file newer than containerd: %q", got)
	}
}

func TestDaemonConfig(t *testing.T) {
	for args, want := range map[string]string{
		"":                                   "",
		"--config /tmp/c.toml":               "/tmp/c.toml",
		"-c /tmp/c.toml --log-level debug":   "/tmp/c.toml",
		"--log-level debug --config=/x.toml": "/x.toml",
		"--address /run/x.sock":              "",
		"--config /tmp/c.toml config dump":   "-",
	} {
		if got := daemonConfig(strings.Fields(args)); got != want {
			t.Errorf("daemonConfig(%q) = %q, want %q", args, got, want)
		}
	}
}
