package agent

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// bundleOf decodes spec as the agent does.
func bundleOf(t *testing.T, spec *specs.Spec) *bundleSpec {
	t.Helper()
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	b, err := decodeBundleSpec(data)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// roundTrip is what the runtime reads of b, with the root at /r.
func roundTrip(t *testing.T, b *bundleSpec) *specs.Spec {
	t.Helper()
	data, err := b.marshal("/r")
	if err != nil {
		t.Fatal(err)
	}
	var out specs.Spec
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

func baseSpec(version string) *specs.Spec {
	return &specs.Spec{
		Version:     version,
		Process:     &specs.Process{Args: []string{"true"}, Terminal: true, Capabilities: &specs.LinuxCapabilities{Bounding: []string{"CAP_KILL"}}},
		Root:        &specs.Root{Path: "rootfs", Readonly: true},
		Linux:       &specs.Linux{CgroupsPath: "/pod/c", MaskedPaths: []string{"/proc/kcore"}},
		Mounts:      []specs.Mount{{Destination: "/proc", Type: "proc"}, {Destination: "run/x", Type: "tmpfs"}},
		Annotations: map[string]string{"a": "b"},
	}
}

// TestBundleSpec: what the agent reads and sets, and that everything else
// reaches the runtime as the host sent it.
func TestBundleSpec(t *testing.T) {
	b := bundleOf(t, baseSpec("1.1.0"))
	if !b.Terminal || len(b.Args) != 1 || b.CgroupsPath != "/pod/c" || b.Version != "1.1.0" {
		t.Fatalf("decoded %+v", b)
	}
	b.CgroupsPath = "/cocoon/c"
	out := roundTrip(t, b)
	if out.Root.Path != "/r" || !out.Root.Readonly || out.Linux.CgroupsPath != "/cocoon/c" {
		t.Errorf("root %+v, cgroupsPath %q", out.Root, out.Linux.CgroupsPath)
	}
	if out.Process.Capabilities.Bounding[0] != "CAP_KILL" || out.Linux.MaskedPaths[0] != "/proc/kcore" ||
		out.Annotations["a"] != "b" || len(out.Mounts) != 2 {
		t.Errorf("the rest changed: %+v", out)
	}
	for _, bad := range []string{`[]`, `null`, `{"process": 3}`, `{"linux": {"cgroupsPath": 3}}`, `{"process": {"args": "sh"}}`} {
		if _, err := decodeBundleSpec([]byte(bad)); err == nil {
			t.Errorf("%s decoded", bad)
		}
	}
}

func TestDownlevelSpec(t *testing.T) {
	for _, v := range []string{"", "1.0.2-dev", "1.1.0", "1.1.0-rc.1"} {
		b := bundleOf(t, baseSpec(v))
		if err := b.downlevel("c"); err != nil || b.Version != v {
			t.Errorf("%q: %v, version %q; want it untouched", v, err, b.Version)
		}
		if out := roundTrip(t, b); out.Mounts[1].Destination != "run/x" {
			t.Errorf("%q: mount %q, want it untouched", v, out.Mounts[1].Destination)
		}
	}
	for _, v := range []string{"1.2.0", "1.2.1", "1.3.0", "1.10.0-dev"} {
		b := bundleOf(t, baseSpec(v))
		if err := b.downlevel("c"); err != nil || b.Version != runtimeSpecVersion {
			t.Errorf("%q: %v, version %q; want %s", v, err, b.Version, runtimeSpecVersion)
		}
		if out := roundTrip(t, b); out.Version != runtimeSpecVersion || out.Mounts[1].Destination != "/run/x" || out.Mounts[1].Type != "tmpfs" {
			t.Errorf("%q: version %q, mount %+v; want %s and /run/x", v, out.Version, out.Mounts[1], runtimeSpecVersion)
		}
	}

	refused := []struct {
		name, want string
		change     func(*specs.Spec)
	}{
		{"exec cpu affinity", "process.execCPUAffinity", func(s *specs.Spec) { s.Process.ExecCPUAffinity = &specs.CPUAffinity{Final: "0"} }},
		{"idmapped mount", "mounts[/data].options idmap", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data", Type: "tmpfs", Options: []string{"idmap"}})
		}},
		{"memory policy", "linux.memoryPolicy", func(s *specs.Spec) { s.Linux.MemoryPolicy = &specs.LinuxMemoryPolicy{Mode: "MPOL_BIND"} }},
		{"net devices", "linux.netDevices", func(s *specs.Spec) { s.Linux.NetDevices = map[string]specs.LinuxNetDevice{"eth1": {}} }},
		{"rdt schemata", "linux.intelRdt", func(s *specs.Spec) { s.Linux.IntelRdt = &specs.LinuxIntelRdt{Schemata: []string{"L3:0=f"}} }},
	}
	for _, tc := range refused {
		s := baseSpec("1.3.0")
		tc.change(s)
		err := bundleOf(t, s).downlevel("c")
		if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "1.3.0") {
			t.Errorf("%s: %v; want NotImplemented naming %q", tc.name, err, tc.want)
		}
	}

	for _, v := range []string{"2.0.0", "1", "x.y.z", "1.-1.0"} {
		if err := bundleOf(t, baseSpec(v)).downlevel("c"); err == nil || !strings.Contains(err.Error(), v) {
			t.Errorf("ociVersion %q accepted (%v)", v, err)
		}
	}
}
