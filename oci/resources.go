package oci

import (
	"fmt"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/runtime/config"
)

// GuestOverheadMiB is what a guest needs besides its container's memory
// limit: its kernel, the agent, crun and the page cache of the container's
// files. A VM is sized to hold the limit and this together.
const GuestOverheadMiB = 64

// SizeForResources makes the VM of cfg large enough for what the first
// container's limits ask (nerdctl run --memory/--cpus, docker run
// -m/--cpus): at least its memory limit plus GuestOverheadMiB, rounded up
// to whole MiB, and at least its CPU quota in whole vCPUs. The configured
// size stays when it is enough: a limit smaller than the VM is the
// guest's cgroup's to enforce, and the VM keeps the shape its template
// has. An annotation that sets the size (io.cocoon.memory_mib,
// io.cocoon.vcpus) wins: it is the VM asked for. A size past config's
// bounds is refused, naming the limit.
func SizeForResources(cfg config.Config, annotations map[string]string, r *specs.LinuxResources) (config.Config, error) {
	if r == nil {
		return cfg, nil
	}
	if _, set := annotations[AnnotationMemoryMiB]; !set && r.Memory != nil && r.Memory.Limit != nil && *r.Memory.Limit > 0 {
		mib := (*r.Memory.Limit+1<<20-1)>>20 + GuestOverheadMiB
		if mib > config.MaxMemoryMiB {
			return cfg, fmt.Errorf("linux.resources.memory.limit %d: a VM for it would need %d MiB, more than the %d MiB a VM may have: %w", *r.Memory.Limit, mib, config.MaxMemoryMiB, errdefs.ErrInvalidArgument)
		}
		cfg.Hypervisor.MemoryMiB = max(cfg.Hypervisor.MemoryMiB, int(mib))
	}
	if _, set := annotations[AnnotationVCPUs]; !set && r.CPU != nil && r.CPU.Quota != nil && *r.CPU.Quota > 0 {
		period := uint64(100000)
		if r.CPU.Period != nil && *r.CPU.Period > 0 {
			period = *r.CPU.Period
		}
		n := (uint64(*r.CPU.Quota) + period - 1) / period
		if n > config.MaxVCPUs {
			return cfg, fmt.Errorf("linux.resources.cpu: a quota of %d per %d us is more than the %d vCPUs a VM may have: %w", *r.CPU.Quota, period, config.MaxVCPUs, errdefs.ErrInvalidArgument)
		}
		cfg.Hypervisor.VCPUs = max(cfg.Hypervisor.VCPUs, int(n))
	}
	return cfg, nil
}
