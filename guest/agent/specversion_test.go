package agent

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestDownlevelSpec(t *testing.T) {
	base := func(version string) *specs.Spec {
		return &specs.Spec{
			Version: version,
			Process: &specs.Process{Args: []string{"true"}},
			Linux:   &specs.Linux{},
			Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc"}, {Destination: "run/x", Type: "tmpfs"}},
		}
	}
	for _, v := range []string{"", "1.0.2-dev", "1.1.0", "1.1.0-rc.1"} {
		s := base(v)
		if err := downlevelSpec("c", s); err != nil || s.Version != v || s.Mounts[1].Destination != "run/x" {
			t.Errorf("%q: %v, version %q, mount %q; want it untouched", v, err, s.Version, s.Mounts[1].Destination)
		}
	}
	for _, v := range []string{"1.2.0", "1.2.1", "1.3.0", "1.10.0-dev"} {
		s := base(v)
		if err := downlevelSpec("c", s); err != nil || s.Version != runtimeSpecVersion || s.Mounts[1].Destination != "/run/x" {
			t.Errorf("%q: %v, version %q, mount %q; want %s and /run/x", v, err, s.Version, s.Mounts[1].Destination, runtimeSpecVersion)
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
		{"rdt schemata", "linux.intelRdt", func(s *specs.Spec) { s.Linux.IntelRdt = &specs.LinuxIntelRdt{Schemata: []string{"L3:0=f"}} }},
	}
	for _, tc := range refused {
		s := base("1.3.0")
		tc.change(s)
		err := downlevelSpec("c", s)
		if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "1.3.0") {
			t.Errorf("%s: %v; want NotImplemented naming %q", tc.name, err, tc.want)
		}
	}

	for _, v := range []string{"2.0.0", "1", "x.y.z", "1.-1.0"} {
		if err := downlevelSpec("c", base(v)); err == nil || !strings.Contains(err.Error(), v) {
			t.Errorf("ociVersion %q accepted (%v)", v, err)
		}
	}
}
