package deploy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/containerdconfig"
)

// fakeHost is a containerd 2.4 whose dump is the drop-in's content (the
// handler's table, as containerd 2.x reads it), or nothing; it counts
// restarts.
type fakeHost struct {
	root        string
	restarts    int
	failRestart bool
}

func (h *fakeHost) Containerd(_ context.Context, args ...string) ([]byte, error) {
	if len(args) == 1 && args[0] == "--version" {
		return []byte("containerd github.com/containerd/containerd/v2 v2.4.2 \n"), nil
	}
	if len(args) == 4 && args[0] == "--config" && args[2] == "config" && args[3] == "dump" {
		data, err := os.ReadFile(filepath.Join(h.root, containerdconfig.DropInPath(args[1])))
		if os.IsNotExist(err) {
			return []byte("version = 4\n"), nil
		}
		return data, err
	}
	return nil, fmt.Errorf("fake containerd: %q", args)
}

func (h *fakeHost) RestartContainerd(context.Context) error {
	h.restarts++
	if h.failRestart {
		return fmt.Errorf("containerd.service failed")
	}
	return nil
}

// fakeNodes records the nodes' labels.
type fakeNodes map[string]string

func (n fakeNodes) SetNodeLabel(_ context.Context, node, key, value string) error {
	n[node+" "+key] = value
	return nil
}

func (n fakeNodes) RemoveNodeLabel(_ context.Context, node, key string) error {
	delete(n, node+" "+key)
	return nil
}

// tree is every file and directory under root, with each file's digest
// and mode.
func tree(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v", strings.TrimPrefix(path, root), fi.Mode())
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			fmt.Fprintf(&b, " %s", hex.EncodeToString(sum[:8]))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func write(t *testing.T, path, content string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// node is a host root as the DaemonSet mounts it (each of HostDirs
// there), with containerd's config and an older cocoon CLI that make
// install put there, and the installer's payload.
func node(t *testing.T) (Options, *fakeHost, fakeNodes) {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "host")
	for _, d := range HostDirs() {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(root, "etc/containerd/config.toml"), "# the node's\nversion = 3\n", 0o600)
	write(t, filepath.Join(root, "usr/local/bin/cocoon"), "old cocoon", 0o755)
	write(t, filepath.Join(root, "usr/local/share/cocoon/manifest.json"), "{}", 0o644)
	payload := filepath.Join(dir, "payload")
	write(t, filepath.Join(payload, "usr/local/bin/cocoon"), "cocoon", 0o755)
	write(t, filepath.Join(payload, "usr/local/bin/containerd-shim-cocoon-v2"), "shim", 0o755)
	write(t, filepath.Join(payload, "usr/local/share/cocoon/vmlinux"), "kernel", 0o644)
	write(t, filepath.Join(payload, "usr/local/share/cocoon/manifest.json"), "{}", 0o644)
	write(t, filepath.Join(dir, "configmap/config.toml"), "[hypervisor]\nmemory_mib = 512\n", 0o644)
	h := &fakeHost{root: root}
	n := fakeNodes{}
	return Options{
		HostRoot: root, Payload: payload, CocoonConfig: filepath.Join(dir, "configmap/config.toml"),
		Restart: true, Node: "node-1", Host: h, Nodes: n,
	}, h, n
}

// TestInstallUninstall: install places the files, adds the handler,
// restarts containerd once and labels the node; a second install does
// nothing; uninstall leaves the host root as it was, the older cocoon
// put back and the file that was there already kept.
func TestInstallUninstall(t *testing.T) {
	o, h, nodes := node(t)
	before := tree(t, o.HostRoot)
	var out bytes.Buffer
	if err := Install(context.Background(), o, &out); err != nil {
		t.Fatalf("Install: %v\n%s", err, out.String())
	}
	t.Logf("install:\n%s", out.String())
	for path, want := range map[string]string{
		"usr/local/bin/cocoon":                    "cocoon",
		"usr/local/bin/containerd-shim-cocoon-v2": "shim",
		"usr/local/share/cocoon/vmlinux":          "kernel",
		"etc/cocoon/config.toml":                  "[hypervisor]\nmemory_mib = 512\n",
	} {
		if got, err := os.ReadFile(filepath.Join(o.HostRoot, path)); err != nil || string(got) != want {
			t.Errorf("/%s: %q, %v; want %q", path, got, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(o.HostRoot, "usr/local/bin/containerd-shim-cocoon-v2")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("the shim's mode: %v, %v", fi.Mode(), err)
	}
	if _, err := os.Stat(filepath.Join(o.HostRoot, "etc/containerd/conf.d/cocoon.toml")); err != nil {
		t.Errorf("no drop-in: %v", err)
	}
	if h.restarts != 1 || nodes["node-1 "+NodeLabel] != NodeLabelValue {
		t.Fatalf("restarts %d, labels %v; want one restart and the label", h.restarts, nodes)
	}
	installed := tree(t, o.HostRoot)

	out.Reset()
	if err := Install(context.Background(), o, &out); err != nil {
		t.Fatalf("second Install: %v", err)
	}
	if got := tree(t, o.HostRoot); got != installed || h.restarts != 1 {
		t.Fatalf("a second install changed the host (restarts %d):\n%s\nwas\n%s", h.restarts, got, installed)
	}

	out.Reset()
	if err := Uninstall(context.Background(), o, &out); err != nil {
		t.Fatalf("Uninstall: %v\n%s", err, out.String())
	}
	t.Logf("uninstall:\n%s", out.String())
	if got := tree(t, o.HostRoot); got != before {
		t.Fatalf("after uninstall the host is\n%s\nwant\n%s", got, before)
	}
	if h.restarts != 2 || len(nodes) != 0 {
		t.Fatalf("restarts %d, labels %v; want a second restart and no label", h.restarts, nodes)
	}
	out.Reset()
	if err := Uninstall(context.Background(), o, &out); err != nil || tree(t, o.HostRoot) != before || h.restarts != 2 {
		t.Fatalf("a second Uninstall: %v, restarts %d\n%s", err, h.restarts, out.String())
	}
}

// TestUninstallKeepsChanges: a file changed since install is left, with
// the file it replaced kept.
func TestUninstallKeepsChanges(t *testing.T) {
	o, _, _ := node(t)
	if err := Install(context.Background(), o, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	cli := filepath.Join(o.HostRoot, "usr/local/bin/cocoon")
	write(t, cli, "newer cocoon, by hand", 0o755)
	var out bytes.Buffer
	if err := Uninstall(context.Background(), o, &out); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(cli); string(got) != "newer cocoon, by hand" || !strings.Contains(out.String(), "left /usr/local/bin/cocoon") {
		t.Fatalf("the changed file: %q\n%s", got, out.String())
	}
	if got, _ := os.ReadFile(filepath.Join(o.HostRoot, DefaultStateDir, "backup/usr/local/bin/cocoon")); string(got) != "old cocoon" {
		t.Fatalf("the replaced file is not kept: %q", got)
	}
	if _, err := os.Stat(filepath.Join(o.HostRoot, "usr/local/bin/containerd-shim-cocoon-v2")); !os.IsNotExist(err) {
		t.Fatalf("the shim is still there: %v", err)
	}
}

// TestInstallRestartFails: a containerd that does not come back on the
// new configuration gets the old one back, and a second restart.
func TestInstallRestartFails(t *testing.T) {
	o, h, nodes := node(t)
	h.failRestart = true
	config := filepath.Join(o.HostRoot, "etc/containerd/config.toml")
	orig, _ := os.ReadFile(config)
	if err := Install(context.Background(), o, &bytes.Buffer{}); err == nil {
		t.Fatal("Install succeeded with a containerd that does not restart")
	}
	if got, _ := os.ReadFile(config); string(got) != string(orig) || h.restarts != 2 || len(nodes) != 0 {
		t.Fatalf("config %q, restarts %d, labels %v; want the original, two restarts, no label", got, h.restarts, nodes)
	}
	if _, err := os.Stat(filepath.Join(o.HostRoot, "etc/containerd/conf.d/cocoon.toml")); !os.IsNotExist(err) {
		t.Fatalf("the drop-in is left: %v", err)
	}
}

// TestInstallRefusesUnmounted: in a container, install writes only to
// the host directories mounted under the host root.
func TestInstallRefusesUnmounted(t *testing.T) {
	o, _, _ := node(t)
	if err := os.RemoveAll(filepath.Join(o.HostRoot, "etc/cocoon")); err != nil {
		t.Fatal(err)
	}
	if err := Install(context.Background(), o, &bytes.Buffer{}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Install without /etc/cocoon mounted: %v", err)
	}
	o, _, _ = node(t)
	o.ContainerdConfig = "/etc/k3s/containerd/config.toml"
	if err := Install(context.Background(), o, &bytes.Buffer{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Install of a config outside the mounts: %v", err)
	}
}

// stopAfterLabel cancels the pod's context once the node is labelled,
// the last step of install: as a SIGTERM would, right after.
type stopAfterLabel struct {
	fakeNodes
	stop context.CancelFunc
}

func (s stopAfterLabel) SetNodeLabel(ctx context.Context, node, key, value string) error {
	defer s.stop()
	return s.fakeNodes.SetNodeLabel(ctx, node, key, value)
}

// TestRun: the DaemonSet's command installs, and when its pod is told to
// stop, uninstalls, though the context it was given has ended.
func TestRun(t *testing.T) {
	o, h, nodes := node(t)
	before := tree(t, o.HostRoot)
	ctx, cancel := context.WithCancel(context.Background())
	o.Nodes = stopAfterLabel{nodes, cancel}
	var out bytes.Buffer
	if err := Run(ctx, o, &out); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "cocoon deploy: installed\n") || !strings.HasSuffix(out.String(), "cocoon deploy: uninstalled\n") {
		t.Fatalf("Run said\n%s", out.String())
	}
	if got := tree(t, o.HostRoot); got != before || h.restarts != 2 || len(nodes) != 0 {
		t.Fatalf("after Run (restarts %d, labels %v) the host is\n%s\nwant\n%s", h.restarts, nodes, got, before)
	}
}
