package oci

import (
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/runtime/config"
)

func TestSizeForResources(t *testing.T) {
	base := config.Default()
	mem := func(b int64) *specs.LinuxMemory { return &specs.LinuxMemory{Limit: &b} }
	cpu := func(q int64, p uint64) *specs.LinuxCPU { return &specs.LinuxCPU{Quota: &q, Period: &p} }
	for _, tc := range []struct {
		name      string
		r         *specs.LinuxResources
		ann       map[string]string
		mib, cpus int
	}{
		{"none", nil, nil, base.Hypervisor.MemoryMiB, base.Hypervisor.VCPUs},
		{"a small limit keeps the VM", &specs.LinuxResources{Memory: mem(64 << 20), CPU: cpu(50000, 100000)}, nil, base.Hypervisor.MemoryMiB, base.Hypervisor.VCPUs},
		{"memory 512m", &specs.LinuxResources{Memory: mem(512 << 20)}, nil, 512 + GuestOverheadMiB, base.Hypervisor.VCPUs},
		{"memory rounds up", &specs.LinuxResources{Memory: mem(512<<20 + 1)}, nil, 513 + GuestOverheadMiB, base.Hypervisor.VCPUs},
		{"unlimited", &specs.LinuxResources{Memory: mem(-1)}, nil, base.Hypervisor.MemoryMiB, base.Hypervisor.VCPUs},
		{"cpus 2.5", &specs.LinuxResources{CPU: cpu(250000, 100000)}, nil, base.Hypervisor.MemoryMiB, 3},
		{"annotations win", &specs.LinuxResources{Memory: mem(1 << 30), CPU: cpu(200000, 100000)},
			map[string]string{AnnotationMemoryMiB: "512", AnnotationVCPUs: "1"}, base.Hypervisor.MemoryMiB, base.Hypervisor.VCPUs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SizeForResources(base, tc.ann, tc.r)
			if err != nil {
				t.Fatal(err)
			}
			if got.Hypervisor.MemoryMiB != tc.mib || got.Hypervisor.VCPUs != tc.cpus {
				t.Errorf("got %d MiB %d vCPUs, want %d MiB %d vCPUs", got.Hypervisor.MemoryMiB, got.Hypervisor.VCPUs, tc.mib, tc.cpus)
			}
		})
	}
	if _, err := SizeForResources(base, nil, &specs.LinuxResources{CPU: cpu(1000*100000, 100000)}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a quota of 1000 CPUs: %v", err)
	}
}
