package hostcgroup

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// v1Limiter writes a group's limits on a cgroup v1 host.
type v1Limiter struct {
	// cg is the group, in every v1 hierarchy.
	cg cgroup1.Cgroup
	// memory, cpu and pids are the group's directories in those
	// controllers' hierarchies, "" where the host mounts none;
	// cpuMount is where the cpu hierarchy is mounted.
	memory, cpu, pids string
	cpuMount          string
}

// newV1 makes the cgroup at p in the v1 hierarchies hs (of the
// subsystems subs) through containerd's cgroup1, which also gives a new
// cpuset cgroup, and any parent it makes, its parent's CPUs and memory
// nodes (without them no process could join it).
func newV1(p string, hs []hierarchy, subs []cgroup1.Subsystem) (*v1Limiter, error) {
	cg, err := cgroup1.New(cgroup1.StaticPath(p), &specs.LinuxResources{},
		cgroup1.WithHierarchy(func() ([]cgroup1.Subsystem, error) { return subs, nil }))
	if err != nil {
		return nil, fmt.Errorf("make cgroup %s (v1 hierarchies): %w", p, err)
	}
	v := &v1Limiter{cg: cg}
	for _, h := range hs {
		switch cgroup1.Name(h.name) {
		case cgroup1.Memory:
			v.memory = h.dir
		case cgroup1.Cpu:
			v.cpu, v.cpuMount = h.dir, h.mount
		case cgroup1.Pids:
			v.pids = h.dir
		}
	}
	return v, nil
}

// memoryUsage reads memory.usage_in_bytes.
func (v *v1Limiter) memoryUsage() (int64, error) {
	if v.memory == "" {
		return 0, nil
	}
	return readInt(filepath.Join(v.memory, "memory.usage_in_bytes"))
}

// apply writes memory.limit_in_bytes, cpu.shares, cpu.cfs_period_us,
// cpu.cfs_quota_us and pids.max.
func (v *v1Limiter) apply(l Limits) (Limits, error) {
	for _, need := range []struct {
		set  bool
		dir  string
		name string
	}{
		{l.MemoryBytes > 0, v.memory, "memory"},
		{l.CPUQuota > 0 || l.CPUShares > 0, v.cpu, "cpu"},
		{l.Pids > 0, v.pids, "pids"},
	} {
		if need.set && need.dir == "" {
			return Limits{}, fmt.Errorf("the host mounts no cgroup v1 %s hierarchy for the limit: %w", need.name, errdefs.ErrFailedPrecondition)
		}
	}
	if v.cpu != "" {
		var err error
		if l, err = v.clampQuota(l); err != nil {
			return Limits{}, err
		}
		// A new period is written before the quota: lift the old quota
		// first, lest it and the new period exceed the parent's.
		if old, err := readInt(filepath.Join(v.cpu, "cpu.cfs_period_us")); err != nil {
			return Limits{}, err
		} else if uint64(old) != l.period() {
			lift := int64(-1)
			if err := v.cg.Update(&specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: &lift}}); err != nil {
				return Limits{}, err
			}
		}
	}
	if err := v.cg.Update(v1Resources(l, v.memory != "", v.cpu != "", v.pids != "")); err != nil {
		return Limits{}, err
	}
	// containerd's cgroup1 writes pids.max only to set a cap, not to lift
	// one.
	if v.pids != "" && l.Pids == 0 {
		if err := os.WriteFile(filepath.Join(v.pids, "pids.max"), []byte("max"), 0); err != nil {
			return Limits{}, err
		}
	}
	return l, nil
}

// v1Resources are the limits l in containerd's cgroup1 terms, for the
// controllers the host has: every field set, a zero as the kernel's
// value for no cap (-1) or its default.
func v1Resources(l Limits, memory, cpu, pids bool) *specs.LinuxResources {
	r := &specs.LinuxResources{}
	if memory {
		limit := int64(-1)
		if l.MemoryBytes > 0 {
			limit = l.MemoryBytes
		}
		r.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	if cpu {
		quota := int64(-1)
		if l.CPUQuota > 0 {
			quota = l.CPUQuota
		}
		period, shares := l.period(), l.shares()
		r.CPU = &specs.LinuxCPU{Shares: &shares, Period: &period, Quota: &quota}
	}
	if pids && l.Pids > 0 {
		r.Pids = &specs.LinuxPids{Limit: &l.Pids}
	}
	return r
}

// clampQuota lowers l's CPU quota to the share of a CPU that the nearest
// ancestor with a quota has (the pod's cgroup, for a pod with a CPU
// limit): a v1 kernel refuses a quota above it with EINVAL, where v2
// caps the child's by its parent's. The pod's own limit binds the VM
// either way.
func (v *v1Limiter) clampQuota(l Limits) (Limits, error) {
	if l.CPUQuota == 0 {
		return l, nil
	}
	for d := filepath.Dir(v.cpu); len(d) > len(v.cpuMount); d = filepath.Dir(d) {
		q, err := readInt(filepath.Join(d, "cpu.cfs_quota_us"))
		if err != nil {
			return Limits{}, err
		}
		if q <= 0 {
			continue
		}
		p, err := readInt(filepath.Join(d, "cpu.cfs_period_us"))
		if err != nil {
			return Limits{}, err
		}
		period := int64(l.period())
		if l.CPUQuota*p <= q*period {
			return l, nil
		}
		l.CPUQuota = q * period / p
		if l.CPUQuota < minCPUQuota {
			return Limits{}, fmt.Errorf("CPU quota: cgroup %s allows %dus in %dus, less than the kernel's least quota in the period of %dus: %w",
				d, q, p, period, errdefs.ErrFailedPrecondition)
		}
		return l, nil
	}
	return l, nil
}
