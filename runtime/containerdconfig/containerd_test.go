package containerdconfig

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// The containerd binaries the edit is checked against: Debian's 1.6 and
// those `make test-deps` installs. Each only reads configuration here
// (`config default`, `config dump`); none is started.
var containerds = []struct {
	name, path string
	plugin     string
}{
	{"1.6", "/usr/bin/containerd", PluginV2},
	{"1.7", "/opt/cocoon-test/containerd-1.7/bin/containerd", PluginV2},
	{"2.4", "/opt/cocoon-test/containerd-2.4/bin/containerd", PluginV3},
}

type containerdBin struct {
	path         string
	major, minor int
}

func findContainerd(t *testing.T, name, path string) containerdBin {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Skipf("containerd %s: %v (Debian's package has 1.6, `make test-deps` installs 1.7 and 2.4)", name, err)
	}
	out := run(t, path, "--version")
	major, minor, err := ParseVersion(string(out))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%d.%d", major, minor); got != name {
		t.Fatalf("%s is containerd %s, want %s", path, got, name)
	}
	return containerdBin{path, major, minor}
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("%s %q: %v: %s", name, args, err, msg)
	}
	return out
}

// dump is `containerd --config path config dump`, decoded, and what it
// says of the handler.
func (c containerdBin) dump(t *testing.T, path string) (map[string]any, DumpHandler) {
	t.Helper()
	out := run(t, c.path, "--config", path, "config", "dump")
	h, err := ParseDump(out, Handler)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if _, err := toml.Decode(string(out), &m); err != nil {
		t.Fatal(err)
	}
	return m, h
}

// installFiles runs Install on the files at path and writes the result.
func installFiles(t *testing.T, path string, major int) (before, after Files) {
	t.Helper()
	before, err := Read("/", path)
	if err != nil {
		t.Fatal(err)
	}
	after, note, err := Install(before, major)
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	t.Logf("install: %s", note)
	if err := Write("/", before, after); err != nil {
		t.Fatal(err)
	}
	return before, after
}

// uninstallFiles runs Uninstall on the files at path, writes the result
// and checks the files are back as before.
func uninstallFiles(t *testing.T, path string, before Files) {
	t.Helper()
	in, err := Read("/", path)
	if err != nil {
		t.Fatal(err)
	}
	out, note, err := Uninstall(in)
	if err != nil {
		t.Fatalf("Uninstall: %v", err)
	}
	t.Logf("uninstall: %s", note)
	if err := Write("/", in, out); err != nil {
		t.Fatal(err)
	}
	back, err := Read("/", path)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Equal(before) {
		t.Fatalf("after Uninstall the files are\n%s\n(exists %v, drop-in %v)\nwant\n%s", back.Main.Data, back.Main.Exists, back.DropIn.Exists, before.Main.Data)
	}
}

// checkHandler checks that a dump has the handler as Tables sets it, in
// the plugin of that containerd.
func checkHandler(t *testing.T, h DumpHandler, plugin string) {
	t.Helper()
	if h.DefaultRuntime == "" || !h.DefaultRuntimeFound {
		t.Fatalf("dump: the default runtime %q is not among the runtimes", h.DefaultRuntime)
	}
	if h.Plugin != plugin || h.Problem() != "" {
		t.Fatalf("dump: handler in %q (%s), want it in %s", h.Plugin, h.Problem(), plugin)
	}
	rt := h.Runtime
	if !slices.Equal(rt.PodAnnotations, []string{AnnotationPattern}) || !slices.Equal(rt.ContainerAnnotations, []string{AnnotationPattern}) || !rt.PrivilegedWithoutHostDevices {
		t.Fatalf("dump: runtime %+v", rt)
	}
}

func lookup(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		t, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = t[k]
	}
	return v
}

// TestContainerdDefaultConfig: each containerd's own default config,
// edited, reads back with the handler in the CRI plugin of that version,
// twice installed is once installed, and uninstalled is byte for byte
// the default again.
func TestContainerdDefaultConfig(t *testing.T) {
	for _, tc := range containerds {
		t.Run(tc.name, func(t *testing.T) {
			c := findContainerd(t, tc.name, tc.path)
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(path, run(t, c.path, "config", "default"), 0o644); err != nil {
				t.Fatal(err)
			}
			before, after := installFiles(t, path, c.major)
			_, h := c.dump(t, path)
			checkHandler(t, h, tc.plugin)
			if again, note, err := Install(after, c.major); err != nil || !again.Equal(after) {
				t.Fatalf("a second Install changed the files (%s, %v)", note, err)
			}
			uninstallFiles(t, path, before)
			if _, h := c.dump(t, path); h.Found() {
				t.Fatalf("uninstalled, the dump still has the handler in %s", h.Plugin)
			}
		})
	}
}

// userConfigs are a node's own configuration, by layout: comments,
// settings away from the defaults, and an imports array whose file
// sets another.
var userConfigs = map[string]string{
	PluginV2: `# This node's containerd: Debian's CNI plugins, our registry's pause.
version = 2
imports = ["site.toml"] # the site's settings

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.example/pause:3.9"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni" # Debian's
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
`,
	PluginV3: `# This node's containerd: Debian's CNI plugins, our registry's pause.
version = 3
imports = [
  "site.toml", # the site's settings
]

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = 'registry.example/pause:3.9'

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['/usr/lib/cni'] # Debian's

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
`,
}

const siteConfig = "version = 2\noom_score = -999\n"

// checkUserSettings checks that a dump kept the settings of userConfigs
// and of the file it imports.
func checkUserSettings(t *testing.T, m map[string]any, plugin string) {
	t.Helper()
	runtime := lookup(m, "plugins", plugin)
	cni, sandbox := lookup(m, "plugins", plugin, "cni", "bin_dir"), lookup(m, "plugins", plugin, "sandbox_image")
	if plugin == PluginV3 {
		cni, sandbox = lookup(m, "plugins", plugin, "cni", "bin_dirs"), lookup(m, "plugins", "io.containerd.cri.v1.images", "pinned_images", "sandbox")
	}
	for what, got := range map[string]any{
		"cni":           fmt.Sprint(cni),
		"sandbox image": sandbox,
		"SystemdCgroup": lookup(runtime.(map[string]any), "containerd", "runtimes", "runc", "options", "SystemdCgroup"),
		"oom_score":     m["oom_score"],
	} {
		want := map[string]any{"cni": "[/usr/lib/cni]", "sandbox image": "registry.example/pause:3.9", "SystemdCgroup": true, "oom_score": int64(-999)}[what]
		if what == "cni" && plugin == PluginV2 {
			want = "/usr/lib/cni"
		}
		if got != want {
			t.Errorf("dump: %s is %v, want the node's %v", what, got, want)
		}
	}
}

// TestContainerdUserConfig: a node's own configuration, comments,
// imports and all, keeps every setting once edited (the dump of the
// edited file has them and the handler), and gets its bytes back.
func TestContainerdUserConfig(t *testing.T) {
	for _, tc := range containerds {
		t.Run(tc.name, func(t *testing.T) {
			c := findContainerd(t, tc.name, tc.path)
			dir := t.TempDir()
			path := filepath.Join(dir, "config.toml")
			os.WriteFile(filepath.Join(dir, "site.toml"), []byte(siteConfig), 0o644)
			if err := os.WriteFile(path, []byte(userConfigs[tc.plugin]), 0o640); err != nil {
				t.Fatal(err)
			}
			m, _ := c.dump(t, path)
			checkUserSettings(t, m, tc.plugin)
			before, _ := installFiles(t, path, c.major)
			m, h := c.dump(t, path)
			checkHandler(t, h, tc.plugin)
			checkUserSettings(t, m, tc.plugin)
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
				t.Fatalf("the edited file's mode: %v %v, want 0640 as it was", fi.Mode(), err)
			}
			uninstallFiles(t, path, before)
		})
	}
}

// TestContainerdVersion2On2x: a version 2 file edited for containerd
// 1.x, read by containerd 2.4 (a node upgraded without migrating its
// file): 2.4 migrates the appended table with the rest.
func TestContainerdVersion2On2x(t *testing.T) {
	c := findContainerd(t, "2.4", containerds[2].path)
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	os.WriteFile(filepath.Join(dir, "site.toml"), []byte(siteConfig), 0o644)
	if err := os.WriteFile(path, []byte(userConfigs[PluginV2]), 0o644); err != nil {
		t.Fatal(err)
	}
	before, _ := installFiles(t, path, c.major)
	m, h := c.dump(t, path)
	checkHandler(t, h, PluginV3)
	if got := fmt.Sprint(lookup(m, "plugins", PluginV3, "cni", "bin_dirs")); got != "[/usr/lib/cni]" {
		t.Errorf("dump: cni bin_dirs %s, want the node's [/usr/lib/cni]", got)
	}
	uninstallFiles(t, path, before)
}

// TestContainerdMissingConfig: with no config file, install makes one
// that each containerd reads as its defaults plus the handler, and
// uninstall removes it (and the drop-in) again.
func TestContainerdMissingConfig(t *testing.T) {
	for _, tc := range containerds {
		t.Run(tc.name, func(t *testing.T) {
			c := findContainerd(t, tc.name, tc.path)
			path := filepath.Join(t.TempDir(), "config.toml")
			before, _ := installFiles(t, path, c.major)
			m, h := c.dump(t, path)
			checkHandler(t, h, tc.plugin)
			if _, ok := lookup(m, "plugins", tc.plugin, "containerd", "runtimes", "runc").(map[string]any); !ok {
				t.Errorf("dump: no runc runtime: the defaults are not all there")
			}
			uninstallFiles(t, path, before)
			for _, p := range []string{path, DropInPath(path)} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("%s after uninstall: %v, want it gone", p, err)
				}
			}
		})
	}
}

// TestContainerd1xImportReplacesCRI shows why the handler goes into the
// main file for containerd 1.x: a file it imports replaces the main
// file's CRI table whole, so a drop-in would reset the node's CRI
// settings (and an import of the node's own that holds CRI settings
// hides the appended handler, which the installer's check of the dump
// finds).
func TestContainerd1xImportReplacesCRI(t *testing.T) {
	for _, tc := range containerds[:2] {
		t.Run(tc.name, func(t *testing.T) {
			c := findContainerd(t, tc.name, tc.path)
			dir := t.TempDir()
			path := filepath.Join(dir, "config.toml")
			os.WriteFile(filepath.Join(dir, "site.toml"), []byte(siteConfig), 0o644)
			os.WriteFile(path, []byte(userConfigs[PluginV2]), 0o644)
			snippet, _ := Snippet(2)
			drop := filepath.Join(dir, "drop.toml")
			os.WriteFile(drop, []byte(snippet), 0o644)
			f, _ := Read("/", path)
			with, _, err := addImport(path, f.Main.Data, mustDecode(t, f.Main.Data), drop)
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(path, with, 0o644)
			m, h := c.dump(t, path)
			if !h.Found() || lookup(m, "plugins", PluginV2, "sandbox_image") == "registry.example/pause:3.9" {
				t.Fatalf("containerd %s merged the imported CRI table key by key: the drop-in would do for it", tc.name)
			}
		})
	}
}

func mustDecode(t *testing.T, data []byte) tomlDoc {
	t.Helper()
	d, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestContainerd1xDropsDefaultRuntime shows why the block brings runc
// along on containerd 1.x: a file that defines one runtime, and not
// runc, leaves the default runtime name without a runtime.
func TestContainerd1xDropsDefaultRuntime(t *testing.T) {
	for _, tc := range containerds[:2] {
		t.Run(tc.name, func(t *testing.T) {
			c := findContainerd(t, tc.name, tc.path)
			path := filepath.Join(t.TempDir(), "config.toml")
			snippet, _ := Snippet(2)
			os.WriteFile(path, []byte(snippet), 0o644)
			_, h := c.dump(t, path)
			if !h.Found() || h.DefaultRuntime != "runc" || h.DefaultRuntimeFound {
				t.Fatalf("containerd %s kept its default runtime next to the file's: %+v", tc.name, h)
			}
		})
	}
}
