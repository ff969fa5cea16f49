package hostcgroup

import (
	"math"
	"testing"
)

// TestV2Resources checks what would be written on a unified host, which
// the tests here cannot reach on a v1 one: every field, a zero as "max"
// or the default weight, shares as a weight.
func TestV2Resources(t *testing.T) {
	all := []string{"cpu", "memory", "pids"}
	for _, tc := range []struct {
		l               Limits
		memory          int64
		cpuMax          string
		weight          uint64
		pids            int64
		enabled         []string
		noCPU, noMemory bool
		noPids          bool
	}{
		{l: LimitsForVM(2048, 2, 256), memory: 2304 << 20, cpuMax: "200000 100000", weight: 100, pids: -1, enabled: all},
		{l: Limits{}, memory: math.MaxInt64, cpuMax: "max 100000", weight: 100, pids: -1, enabled: all},
		{l: Limits{CPUQuota: 25000, CPUPeriod: 50000, CPUShares: 2, Pids: 64}, memory: math.MaxInt64, cpuMax: "25000 50000", weight: 1, pids: 64, enabled: all},
		{l: Limits{CPUShares: 262144}, memory: math.MaxInt64, cpuMax: "max 100000", weight: 10000, pids: -1, enabled: all},
		{l: Limits{CPUShares: 512}, memory: math.MaxInt64, cpuMax: "max 100000", weight: 59, pids: -1, enabled: all},
		{l: LimitsForVM(512, 1, 0), memory: 512 << 20, enabled: []string{"memory"}, noCPU: true, noPids: true},
	} {
		r := v2Resources(tc.l, tc.enabled)
		switch {
		case tc.noMemory != (r.Memory == nil):
			t.Errorf("%+v: memory %+v", tc.l, r.Memory)
		case r.Memory != nil && *r.Memory.Max != tc.memory:
			t.Errorf("%+v: memory.max %d, want %d", tc.l, *r.Memory.Max, tc.memory)
		}
		switch {
		case tc.noCPU != (r.CPU == nil):
			t.Errorf("%+v: cpu %+v", tc.l, r.CPU)
		case r.CPU != nil && (string(r.CPU.Max) != tc.cpuMax || *r.CPU.Weight != tc.weight):
			t.Errorf("%+v: cpu.max %q, cpu.weight %d; want %q, %d", tc.l, r.CPU.Max, *r.CPU.Weight, tc.cpuMax, tc.weight)
		}
		switch {
		case tc.noPids != (r.Pids == nil):
			t.Errorf("%+v: pids %+v", tc.l, r.Pids)
		case r.Pids != nil && r.Pids.Max != tc.pids:
			t.Errorf("%+v: pids.max %d, want %d", tc.l, r.Pids.Max, tc.pids)
		}
		if vs := r.Values(); len(vs) == 0 {
			t.Errorf("%+v: nothing to write", tc.l)
		}
	}
}

// TestV1Resources checks what containerd's cgroup1 is given: every
// field, a zero as -1 or the default.
func TestV1Resources(t *testing.T) {
	r := v1Resources(Limits{}, true, true, true)
	if *r.Memory.Limit != -1 || *r.CPU.Quota != -1 || *r.CPU.Period != 100000 || *r.CPU.Shares != 1024 || r.Pids != nil {
		t.Errorf("no limits: memory %d, quota %d, period %d, shares %d, pids %+v",
			*r.Memory.Limit, *r.CPU.Quota, *r.CPU.Period, *r.CPU.Shares, r.Pids)
	}
	l := Limits{MemoryBytes: 1 << 30, CPUQuota: 150000, CPUPeriod: 50000, CPUShares: 256, Pids: 10}
	r = v1Resources(l, true, true, true)
	if *r.Memory.Limit != 1<<30 || *r.CPU.Quota != 150000 || *r.CPU.Period != 50000 || *r.CPU.Shares != 256 || *r.Pids.Limit != 10 {
		t.Errorf("%+v: memory %d, quota %d, period %d, shares %d, pids %d",
			l, *r.Memory.Limit, *r.CPU.Quota, *r.CPU.Period, *r.CPU.Shares, *r.Pids.Limit)
	}
	if r = v1Resources(l, false, false, false); r.Memory != nil || r.CPU != nil || r.Pids != nil {
		t.Errorf("with no hierarchy: %+v", r)
	}
}
