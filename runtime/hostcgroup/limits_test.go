package hostcgroup

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestLimitsForVM(t *testing.T) {
	for _, tc := range []struct {
		mem, vcpus, overhead int
		want                 Limits
	}{
		{2048, 2, 256, Limits{MemoryBytes: 2304 << 20, CPUQuota: 200000, CPUPeriod: 100000}},
		{512, 1, 0, Limits{MemoryBytes: 512 << 20, CPUQuota: 100000, CPUPeriod: 100000}},
		{512, 1, -5, Limits{MemoryBytes: 512 << 20, CPUQuota: 100000, CPUPeriod: 100000}},
		{0, 4, 128, Limits{CPUQuota: 400000, CPUPeriod: 100000}},
		{1024, 0, 128, Limits{MemoryBytes: 1152 << 20}},
		{-1, -1, 128, Limits{}},
		// No overflow of an int on the way.
		{1 << 30, 1, 0, Limits{MemoryBytes: 1 << 50, CPUQuota: 100000, CPUPeriod: 100000}},
	} {
		if got := LimitsForVM(tc.mem, tc.vcpus, tc.overhead); got != tc.want {
			t.Errorf("LimitsForVM(%d, %d, %d) = %+v, want %+v", tc.mem, tc.vcpus, tc.overhead, got, tc.want)
		}
		if err := LimitsForVM(tc.mem, tc.vcpus, tc.overhead).validate(); err != nil {
			t.Errorf("LimitsForVM(%d, %d, %d) is not valid: %v", tc.mem, tc.vcpus, tc.overhead, err)
		}
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, l := range []Limits{
		{},
		{MemoryBytes: 1, CPUQuota: 1000, CPUPeriod: 1000, CPUShares: 2, Pids: 1},
		{CPUQuota: 5000000, CPUPeriod: 1000000, CPUShares: 262144},
	} {
		if err := l.validate(); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
	}
	for _, tc := range []struct {
		l    Limits
		says string
	}{
		{Limits{MemoryBytes: -1}, "memory limit -1"},
		{Limits{CPUQuota: -1}, "CPU quota -1"},
		{Limits{CPUQuota: 999}, "least"},
		{Limits{CPUPeriod: 999}, "CPU period 999us"},
		{Limits{CPUPeriod: 1000001}, "CPU period"},
		{Limits{CPUShares: 1}, "CPU shares 1"},
		{Limits{CPUShares: 262145}, "CPU shares"},
		{Limits{Pids: -1}, "pids limit -1"},
	} {
		err := tc.l.validate()
		if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%+v: %v, want an invalid argument that says %q", tc.l, err, tc.says)
		}
	}
}
