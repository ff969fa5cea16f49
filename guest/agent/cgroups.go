//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
)

// Bounds on what is read from cgroupfs.
const (
	// maxCgroupFile bounds one cgroup file read.
	maxCgroupFile = 256 << 10
	// maxPids bounds the pids ContainerPids reports.
	maxPids = 1 << 16
	// maxCgroupDepth bounds the walk of a container's sub-cgroups.
	maxCgroupDepth = 16
)

// readCgroupFile reads a cgroup file, bounded.
func readCgroupFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxCgroupFile))
}

// readKV parses a flat keyed file ("key value" lines: cpu.stat,
// memory.stat, memory.events) into out.
func readKV(path string, out map[string]uint64) error {
	b, err := readCgroupFile(path)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return sc.Err()
}

// readUint reads a single-value file; "max" is math.MaxUint64, as
// containerd's cgroups package reports it; a missing or odd file is 0.
func readUint(path string) uint64 {
	b, err := readCgroupFile(path)
	if err != nil {
		return 0
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return math.MaxUint64
	}
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// readPSI parses a pressure file (some/full avg10= avg60= avg300= total=).
func readPSI(path string) *stats.PSIStats {
	b, err := readCgroupFile(path)
	if err != nil {
		return nil
	}
	psi := &stats.PSIStats{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		d := &stats.PSIData{}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "avg10":
				d.Avg10, _ = strconv.ParseFloat(v, 64)
			case "avg60":
				d.Avg60, _ = strconv.ParseFloat(v, 64)
			case "avg300":
				d.Avg300, _ = strconv.ParseFloat(v, 64)
			case "total":
				d.Total, _ = strconv.ParseUint(v, 10, 64)
			}
		}
		switch f[0] {
		case "some":
			psi.Some = d
		case "full":
			psi.Full = d
		}
	}
	return psi
}

// readIOStat parses io.stat ("maj:min rbytes=.. wbytes=.. rios=.. wios=..").
func readIOStat(path string) []*stats.IOEntry {
	b, err := readCgroupFile(path)
	if err != nil {
		return nil
	}
	var entries []*stats.IOEntry
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		major, minor, err := parseDevNumber(f[0])
		if err != nil {
			continue
		}
		e := &stats.IOEntry{Major: uint64(major), Minor: uint64(minor)}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				continue
			}
			switch k {
			case "rbytes":
				e.Rbytes = n
			case "wbytes":
				e.Wbytes = n
			case "rios":
				e.Rios = n
			case "wios":
				e.Wios = n
			}
		}
		entries = append(entries, e)
	}
	return entries
}

// cgroupMetrics reads the cgroup v2 statistics of the cgroup at dir the
// way containerd's cgroup2 manager does, so that the host hands
// containerd what runc's shim would.
func cgroupMetrics(dir string) (*stats.Metrics, error) {
	if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("cgroup %s: %w", dir, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	kv := make(map[string]uint64, 64)
	for _, f := range []string{"cpu.stat", "memory.stat"} {
		if err := readKV(filepath.Join(dir, f), kv); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
	}
	events := make(map[string]uint64)
	if err := readKV(filepath.Join(dir, "memory.events"), events); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read memory.events: %w", err)
	}
	at := func(name string) string { return filepath.Join(dir, name) }
	m := &stats.Metrics{
		Pids: &stats.PidsStat{
			Current: readUint(at("pids.current")),
			Limit:   readUint(at("pids.max")),
		},
		CPU: &stats.CPUStat{
			UsageUsec:     kv["usage_usec"],
			UserUsec:      kv["user_usec"],
			SystemUsec:    kv["system_usec"],
			NrPeriods:     kv["nr_periods"],
			NrThrottled:   kv["nr_throttled"],
			ThrottledUsec: kv["throttled_usec"],
			PSI:           readPSI(at("cpu.pressure")),
		},
		Memory: &stats.MemoryStat{
			Anon:                  kv["anon"],
			File:                  kv["file"],
			KernelStack:           kv["kernel_stack"],
			Slab:                  kv["slab"],
			Sock:                  kv["sock"],
			Shmem:                 kv["shmem"],
			FileMapped:            kv["file_mapped"],
			FileDirty:             kv["file_dirty"],
			FileWriteback:         kv["file_writeback"],
			AnonThp:               kv["anon_thp"],
			InactiveAnon:          kv["inactive_anon"],
			ActiveAnon:            kv["active_anon"],
			InactiveFile:          kv["inactive_file"],
			ActiveFile:            kv["active_file"],
			Unevictable:           kv["unevictable"],
			SlabReclaimable:       kv["slab_reclaimable"],
			SlabUnreclaimable:     kv["slab_unreclaimable"],
			Pgfault:               kv["pgfault"],
			Pgmajfault:            kv["pgmajfault"],
			WorkingsetRefault:     kv["workingset_refault"],
			WorkingsetActivate:    kv["workingset_activate"],
			WorkingsetNodereclaim: kv["workingset_nodereclaim"],
			Pgrefill:              kv["pgrefill"],
			Pgscan:                kv["pgscan"],
			Pgsteal:               kv["pgsteal"],
			Pgactivate:            kv["pgactivate"],
			Pgdeactivate:          kv["pgdeactivate"],
			Pglazyfree:            kv["pglazyfree"],
			Pglazyfreed:           kv["pglazyfreed"],
			ThpFaultAlloc:         kv["thp_fault_alloc"],
			ThpCollapseAlloc:      kv["thp_collapse_alloc"],
			Usage:                 readUint(at("memory.current")),
			UsageLimit:            readUint(at("memory.max")),
			MaxUsage:              readUint(at("memory.peak")),
			SwapUsage:             readUint(at("memory.swap.current")),
			SwapLimit:             readUint(at("memory.swap.max")),
			SwapMaxUsage:          readUint(at("memory.swap.peak")),
			PSI:                   readPSI(at("memory.pressure")),
		},
		Io: &stats.IOStat{
			Usage: readIOStat(at("io.stat")),
			PSI:   readPSI(at("io.pressure")),
		},
	}
	if len(events) > 0 {
		m.MemoryEvents = &stats.MemoryEvents{
			Low:     events["low"],
			High:    events["high"],
			Max:     events["max"],
			Oom:     events["oom"],
			OomKill: events["oom_kill"],
		}
	}
	return m, nil
}

// cgroupPids lists the processes of the cgroup at dir and of its
// descendants, sorted, at most maxPids.
func cgroupPids(dir string) ([]uint32, error) {
	if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("cgroup %s: %w", dir, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	seen := make(map[uint32]bool)
	var walk func(d string, depth int) error
	walk = func(d string, depth int) error {
		b, err := readCgroupFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				// Removed while we walked.
				return nil
			}
			return err
		}
		for _, line := range strings.Fields(string(b)) {
			n, err := strconv.ParseUint(line, 10, 32)
			if err == nil && len(seen) < maxPids {
				seen[uint32(n)] = true
			}
		}
		if depth >= maxCgroupDepth {
			return nil
		}
		entries, err := os.ReadDir(d)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		for _, e := range entries {
			if e.IsDir() {
				if err := walk(filepath.Join(d, e.Name()), depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(dir, 0); err != nil {
		return nil, fmt.Errorf("list processes of cgroup %s: %w", dir, err)
	}
	pids := make([]uint32, 0, len(seen))
	for p := range seen {
		pids = append(pids, p)
	}
	sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
	return pids, nil
}

// oomKills reads the oom_kill counter of memory.events at path.
func oomKills(path string) (uint64, error) {
	kv := make(map[string]uint64, 8)
	if err := readKV(path, kv); err != nil {
		return 0, err
	}
	return kv["oom_kill"], nil
}
