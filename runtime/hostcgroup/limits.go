package hostcgroup

import (
	"fmt"

	"github.com/containerd/errdefs"
)

const (
	// DefaultCPUPeriod is the kernel's default CFS period, in
	// microseconds, the period LimitsForVM's quota is of.
	DefaultCPUPeriod = 100000
	// The kernel's bounds on a CFS period and the least quota, in
	// microseconds.
	minCPUPeriod = 1000
	maxCPUPeriod = 1000000
	minCPUQuota  = 1000
	// The kernel's default and bounds of cgroup v1's cpu.shares; v2's
	// cpu.weight is derived from them.
	defaultCPUShares = 1024
	minCPUShares     = 2
	maxCPUShares     = 262144
)

// Limits are what a pod's host cgroup caps. A zero field is no cap (or
// the kernel's default, for CPUPeriod and CPUShares): Join and Update
// write every field, so a zero in Update lifts the cap that was there.
type Limits struct {
	// MemoryBytes caps the memory charged to the group: memory.max on v2,
	// memory.limit_in_bytes on v1.
	MemoryBytes int64
	// CPUQuota is the CPU time, in microseconds, the group may use in
	// each CPUPeriod: the quota of cpu.max on v2, cpu.cfs_quota_us on v1.
	CPUQuota int64
	// CPUPeriod is CPUQuota's period in microseconds (1000 to 1000000);
	// zero is DefaultCPUPeriod.
	CPUPeriod uint64
	// CPUShares is the group's CPU weight against its siblings in v1's
	// shares (2 to 262144; zero is the kernel's 1024); on v2 it becomes
	// cpu.weight as containerd and runc convert it.
	CPUShares uint64
	// Pids caps the number of tasks (threads) in the group.
	Pids int64
}

// LimitsForVM returns the limits of the cgroup of a VM with memoryMiB of
// guest RAM and vcpus vCPUs: memory for the guest's RAM and overheadMiB
// more, which is to cover what the VMM, virtiofsd and the shim allocate
// for themselves and the host's page cache that virtiofsd fills (charged
// to the group, reclaimable); CPU time of vcpus whole CPUs. A memoryMiB
// or vcpus that is not positive sets no cap of its kind; a negative
// overheadMiB counts as none.
func LimitsForVM(memoryMiB, vcpus, overheadMiB int) Limits {
	var l Limits
	if memoryMiB > 0 {
		l.MemoryBytes = (int64(memoryMiB) + int64(max(overheadMiB, 0))) << 20
	}
	if vcpus > 0 {
		l.CPUPeriod = DefaultCPUPeriod
		l.CPUQuota = int64(vcpus) * DefaultCPUPeriod
	}
	return l
}

// validate refuses limits the kernel would, with a sentence naming the
// field, before anything is written.
func (l Limits) validate() error {
	switch {
	case l.MemoryBytes < 0:
		return fmt.Errorf("memory limit %d: negative: %w", l.MemoryBytes, errdefs.ErrInvalidArgument)
	case l.CPUQuota < 0:
		return fmt.Errorf("CPU quota %d: negative: %w", l.CPUQuota, errdefs.ErrInvalidArgument)
	case l.CPUQuota > 0 && l.CPUQuota < minCPUQuota:
		return fmt.Errorf("CPU quota %dus: less than the kernel's least, %dus: %w", l.CPUQuota, minCPUQuota, errdefs.ErrInvalidArgument)
	case l.CPUPeriod != 0 && (l.CPUPeriod < minCPUPeriod || l.CPUPeriod > maxCPUPeriod):
		return fmt.Errorf("CPU period %dus: not within %dus to %dus: %w", l.CPUPeriod, minCPUPeriod, maxCPUPeriod, errdefs.ErrInvalidArgument)
	case l.CPUShares != 0 && (l.CPUShares < minCPUShares || l.CPUShares > maxCPUShares):
		return fmt.Errorf("CPU shares %d: not within %d to %d: %w", l.CPUShares, minCPUShares, maxCPUShares, errdefs.ErrInvalidArgument)
	case l.Pids < 0:
		return fmt.Errorf("pids limit %d: negative: %w", l.Pids, errdefs.ErrInvalidArgument)
	}
	return nil
}

// period is the CFS period the limits are of.
func (l Limits) period() uint64 {
	if l.CPUPeriod == 0 {
		return DefaultCPUPeriod
	}
	return l.CPUPeriod
}

// shares is the group's v1 CPU shares.
func (l Limits) shares() uint64 {
	if l.CPUShares == 0 {
		return defaultCPUShares
	}
	return l.CPUShares
}
