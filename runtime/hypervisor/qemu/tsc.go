package qemu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// tscSource names where the host TSC rate is read; tests point it at
// fixtures.
type tscSource struct {
	// sysfs is the kernel's own figure, present on some kernels only.
	sysfs string
	// cpuinfo is /proc/cpuinfo.
	cpuinfo string
}

// localTSC reads this host.
func localTSC() tscSource {
	return tscSource{
		sysfs:   "/sys/devices/system/cpu/cpu0/tsc_freq_khz",
		cpuinfo: "/proc/cpuinfo",
	}
}

// hostTSCKHz returns the host TSC frequency in kHz.
//
// Why the guest needs it: under TCG the guest's TSC is the host's TSC, read
// through emulation, while the PIT it would calibrate against is emulated
// from a different clock at instruction-level slowness. Linux's early
// calibration then fails ("could not calculate TSC khz"), marks the TSC
// unstable and the boot stalls. tsc_early_khz skips that calibration. Under
// KVM the guest learns the rate from kvmclock/CPUID, so the driver passes it
// under TCG only.
//
// It is read at every launch, not cached, since a template may be restored
// on another host.
func (s tscSource) hostTSCKHz() (uint64, error) {
	if data, err := os.ReadFile(s.sysfs); err == nil {
		if khz, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64); err == nil && khz > 0 {
			return khz, nil
		}
	}
	data, err := os.ReadFile(s.cpuinfo)
	if err != nil {
		return 0, fmt.Errorf("read host tsc rate: %w", err)
	}
	return parseCPUInfoTSC(data)
}

// parseCPUInfoTSC takes the first processor's "cpu MHz" as the TSC rate. That
// holds only with constant_tsc, where the TSC ticks at a fixed rate whatever
// the core clock does; without it the figure says nothing about the TSC.
func parseCPUInfoTSC(cpuinfo []byte) (uint64, error) {
	var mhz string
	var flags []string
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			if strings.TrimSpace(sc.Text()) == "" && (mhz != "" || flags != nil) {
				break // end of the first processor
			}
			continue
		}
		switch strings.TrimSpace(k) {
		case "cpu MHz":
			if mhz == "" {
				mhz = strings.TrimSpace(v)
			}
		case "flags":
			if flags == nil {
				flags = strings.Fields(v)
			}
		}
	}
	if !slices.Contains(flags, "constant_tsc") {
		return 0, errors.New("host tsc rate unknown: no tsc_freq_khz in sysfs and the cpu has no constant_tsc")
	}
	if mhz == "" {
		return 0, errors.New("host tsc rate unknown: no \"cpu MHz\" in /proc/cpuinfo")
	}
	khz, err := mhzToKHz(mhz)
	if err != nil {
		return 0, fmt.Errorf("host tsc rate: cpu MHz %q: %w", mhz, err)
	}
	return khz, nil
}

// mhzToKHz converts a decimal MHz figure ("2596.094") to kHz exactly,
// without going through floating point.
func mhzToKHz(s string) (uint64, error) {
	whole, frac, _ := strings.Cut(s, ".")
	if len(frac) > 3 {
		frac = frac[:3]
	}
	frac += strings.Repeat("0", 3-len(frac))
	w, err := strconv.ParseUint(whole, 10, 32)
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseUint(frac, 10, 32)
	if err != nil {
		return 0, err
	}
	khz := w*1000 + f
	if khz == 0 {
		return 0, errors.New("zero")
	}
	return khz, nil
}
