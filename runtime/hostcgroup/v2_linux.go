package hostcgroup

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/errdefs"
)

// v2Controllers are the controllers the limits are written to on a
// unified host, all three of which kubelet needs too.
var v2Controllers = []string{"cpu", "memory", "pids"}

// v2Limiter writes a group's limits on a cgroup v2 (unified) host.
type v2Limiter struct {
	// m is the group.
	m *cgroup2.Manager
	// dir is the group's directory.
	dir string
	// enabled are the controllers of v2Controllers that the host has,
	// which are enabled for the group.
	enabled []string
}

// newV2 enables, down to the group's parent, those of v2Controllers
// that the host has, for the group m at p (which cgroup2.NewManager
// made).
func newV2(p, mount string, m *cgroup2.Manager) (*v2Limiter, error) {
	b, err := os.ReadFile(filepath.Join(mount, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("list the host's cgroup v2 controllers: %w", err)
	}
	have := strings.Fields(string(b))
	v := &v2Limiter{m: m, dir: filepath.Join(mount, p)}
	for _, c := range v2Controllers {
		if slices.Contains(have, c) {
			v.enabled = append(v.enabled, c)
		}
	}
	if len(v.enabled) > 0 {
		if err := m.ToggleControllers(v.enabled, cgroup2.Enable); err != nil {
			return nil, fmt.Errorf("enable the %s controllers for cgroup %s: %w", strings.Join(v.enabled, ", "), p, err)
		}
	}
	return v, nil
}

// memoryUsage reads memory.current.
func (v *v2Limiter) memoryUsage() (int64, error) {
	if !slices.Contains(v.enabled, "memory") {
		return 0, nil
	}
	return readInt(filepath.Join(v.dir, "memory.current"))
}

// apply writes memory.max, cpu.max, cpu.weight and pids.max.
func (v *v2Limiter) apply(l Limits) (Limits, error) {
	for _, need := range []struct {
		set  bool
		name string
	}{
		{l.MemoryBytes > 0, "memory"},
		{l.CPUQuota > 0 || l.CPUShares > 0, "cpu"},
		{l.Pids > 0, "pids"},
	} {
		if need.set && !slices.Contains(v.enabled, need.name) {
			return Limits{}, fmt.Errorf("the host's cgroup v2 hierarchy has no %s controller for the limit: %w", need.name, errdefs.ErrFailedPrecondition)
		}
	}
	if err := v.m.Update(v2Resources(l, v.enabled)); err != nil {
		return Limits{}, err
	}
	return l, nil
}

// v2Resources are the limits l in containerd's cgroup2 terms, for the
// enabled controllers: every field set, a zero as no cap ("max"; the
// largest memory.max is the kernel's "max") or the kernel's default
// weight, and v1 shares converted to a weight as runc and containerd do.
func v2Resources(l Limits, enabled []string) *cgroup2.Resources {
	r := &cgroup2.Resources{}
	if slices.Contains(enabled, "memory") {
		limit := int64(math.MaxInt64)
		if l.MemoryBytes > 0 {
			limit = l.MemoryBytes
		}
		r.Memory = &cgroup2.Memory{Max: &limit}
	}
	if slices.Contains(enabled, "cpu") {
		var quota *int64
		if l.CPUQuota > 0 {
			quota = &l.CPUQuota
		}
		period := l.period()
		weight := cgroup2.ConvertCPUSharesToCgroupV2Value(l.shares())
		r.CPU = &cgroup2.CPU{Weight: &weight, Max: cgroup2.NewCPUMax(quota, &period)}
	}
	if slices.Contains(enabled, "pids") {
		limit := int64(-1)
		if l.Pids > 0 {
			limit = l.Pids
		}
		r.Pids = &cgroup2.Pids{Max: limit}
	}
	return r
}
