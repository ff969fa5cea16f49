package oci

import (
	"fmt"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/runtime/config"
)

// SizeForResources grows the VM of cfg by what the first container's
// limits ask (nerdctl run --memory/--cpus, docker run -m/--cpus), as
// Kata does: the configured size is the guest's own (its kernel, agent
// and page cache), and the container's memory limit and CPU quota come on
// top, rounded up to whole MiB and vCPUs. An annotation that sets the size
// (io.cocoon.memory_mib, io.cocoon.vcpus) wins: it is the VM asked for.
// The limits themselves are applied to the container's cgroup in the
// guest as well. A result past config's bounds is refused, naming it.
func SizeForResources(cfg config.Config, annotations map[string]string, r *specs.LinuxResources) (config.Config, error) {
	if r == nil {
		return cfg, nil
	}
	if _, set := annotations[AnnotationMemoryMiB]; !set && r.Memory != nil && r.Memory.Limit != nil && *r.Memory.Limit > 0 {
		mib := (*r.Memory.Limit + 1<<20 - 1) >> 20
		if mib > config.MaxMemoryMiB {
			return cfg, fmt.Errorf("linux.resources.memory.limit %d: more than a VM's %d MiB: %w", *r.Memory.Limit, config.MaxMemoryMiB, errdefs.ErrInvalidArgument)
		}
		cfg.Hypervisor.MemoryMiB += int(mib)
	}
	if _, set := annotations[AnnotationVCPUs]; !set && r.CPU != nil && r.CPU.Quota != nil && *r.CPU.Quota > 0 {
		period := uint64(100000)
		if r.CPU.Period != nil && *r.CPU.Period > 0 {
			period = *r.CPU.Period
		}
		n := (uint64(*r.CPU.Quota) + period - 1) / period
		if n > config.MaxVCPUs {
			return cfg, fmt.Errorf("linux.resources.cpu: a quota of %d per %d us is more than a VM's %d vCPUs: %w", *r.CPU.Quota, period, config.MaxVCPUs, errdefs.ErrInvalidArgument)
		}
		cfg.Hypervisor.VCPUs += int(n)
	}
	if cfg.Hypervisor.MemoryMiB > config.MaxMemoryMiB || cfg.Hypervisor.VCPUs > config.MaxVCPUs {
		return cfg, fmt.Errorf("the VM sized for the container's limits (%d MiB, %d vCPUs) is past the bounds (%d MiB, %d vCPUs): %w",
			cfg.Hypervisor.MemoryMiB, cfg.Hypervisor.VCPUs, config.MaxMemoryMiB, config.MaxVCPUs, errdefs.ErrInvalidArgument)
	}
	return cfg, nil
}
