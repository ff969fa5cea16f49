package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// memory reads what each of the running pods ids of handler costs: the
// PSS of its shim and of the processes under it, and its cgroup's working
// set as containerd reports it. Each pod has a shim of its own, whose -id
// is the pod's.
func (b *podBench) memory(ctx context.Context, handler string, ids []string) ([]podMemory, error) {
	bin := harness.ShimBinary
	if handler == harness.RuncRuntimeHandler {
		bin = harness.RuncShimBinary
	}
	shims := shimsByID(bin, b.c.Address)
	if len(shims) != len(ids) {
		return nil, fmt.Errorf("%d %s shims for %d pods, want one each", len(shims), bin, len(ids))
	}
	ws, err := b.workingSets(ctx)
	if err != nil {
		return nil, err
	}
	var out []podMemory
	for _, id := range ids {
		pid, ok := shims[id]
		if !ok {
			return nil, fmt.Errorf("no %s shim of pod %s", bin, id)
		}
		w, ok := ws[id]
		if !ok {
			return nil, fmt.Errorf("crictl statsp has no working set of pod %s", id)
		}
		shim, err := rollup(pid)
		if err != nil {
			return nil, err
		}
		m := podMemory{pss: shim.pss, shim: shim.pss, workingSet: w}
		for _, p := range descendants(pid) {
			r, err := rollup(p)
			if errors.Is(err, os.ErrNotExist) {
				continue // exited meanwhile
			}
			if err != nil {
				return nil, err
			}
			m.pss += r.pss
			switch c := comm(p); {
			case strings.HasPrefix(c, "qemu-system"):
				m.qemu += r.pss
			case c == "virtiofsd":
				m.virtiofsd += r.pss
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// shimsByID maps the -id of each shim named binary that the containerd
// at address started to its pid.
func shimsByID(binary, address string) map[string]int {
	out := map[string]int{}
	for _, pid := range harness.ShimPIDsOf(binary, address) {
		cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-id" {
				out[args[i+1]] = pid
			}
		}
	}
	return out
}

// workingSets are the working sets of the pods' cgroups, in MiB by pod
// id, as `crictl statsp` reports them (containerd reads the pod's cgroup:
// for a Cocoon pod the one its shim, QEMU and virtiofsd run in).
func (b *podBench) workingSets(ctx context.Context) (map[string]float64, error) {
	out, err := b.crictl(ctx, "statsp", "-o", "json")
	if err != nil {
		return nil, err
	}
	var v struct {
		Stats []struct {
			Attributes struct {
				ID string `json:"id"`
			} `json:"attributes"`
			Linux struct {
				Memory struct {
					WorkingSetBytes struct {
						// Value is a uint64, which protobuf's JSON
						// writes as a string.
						Value json.RawMessage `json:"value"`
					} `json:"workingSetBytes"`
				} `json:"memory"`
			} `json:"linux"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return nil, fmt.Errorf("crictl statsp: %w:\n%s", err, out)
	}
	ws := map[string]float64{}
	for _, s := range v.Stats {
		raw := strings.Trim(string(s.Linux.Memory.WorkingSetBytes.Value), `"`)
		bytes, err := strconv.ParseFloat(raw, 64)
		if err != nil || bytes <= 0 {
			return nil, fmt.Errorf("crictl statsp: pod %s has working set %q", s.Attributes.ID, raw)
		}
		ws[s.Attributes.ID] = bytes / (1 << 20)
	}
	return ws, nil
}

// podResults are the pod figures, Cocoon next to runc.
func podResults(fs []podFigures) []Result {
	var out []Result
	for _, f := range fs {
		col := func(s [2][]podStart, part func(podStart) float64) [2][]float64 {
			return [2][]float64{column(s[0], part), column(s[1], part)}
		}
		pair := func(name, unit string, s [2][]float64) Result {
			r := median(s[1])
			return Result{Name: name, Unit: unit, Median: median(s[0]), Samples: s[0], Runc: &r, RuncSamples: s[1]}
		}
		only := func(name string, s []float64) Result {
			return Result{Name: name, Unit: "MiB", Median: median(s), Samples: s}
		}
		timed := func(name string, s []float64) Result {
			return Result{Name: name, Unit: "ms", Median: median(s), Samples: s}
		}
		total := col(f.serial, podStart.total)
		p90 := [2][]float64{{percentile(total[0], 0.9)}, {percentile(total[1], 0.9)}}
		mem := func(part func(podMemory) float64) [2][]float64 {
			return [2][]float64{column(f.mem[0], part), column(f.mem[1], part)}
		}
		out = append(out,
			pair(fmt.Sprintf("pod start, containerd %s: runp+create+start (%d)", f.version, len(total[0])), "ms", total),
			pair(fmt.Sprintf("  p90 of the same (of %d, nearest rank)", len(total[0])), "ms", p90),
			pair("  of which runp (cocoon: vm boot, the pause in it)", "ms", col(f.serial, func(s podStart) float64 { return s.runp })),
			timed("    the vm's boot to agent ready (shim's log)", f.ready),
			pair("  of which create", "ms", col(f.serial, func(s podStart) float64 { return s.create })),
			pair("  of which start", "ms", col(f.serial, func(s podStart) float64 { return s.start })),
			pair(fmt.Sprintf("  %d pods at once: wall until all started", podParallel), "ms", f.wall),
			pair("  the same, median of each pod's own start", "ms", col(f.parallel, podStart.total)),
			pair("  of which runp", "ms", col(f.parallel, func(s podStart) float64 { return s.runp })),
			timed("    the vm's boot to agent ready (shim's log)", f.readyParallel),
			pair(fmt.Sprintf("pss per pod, %d running (runc: shim+pause+ctr)", podParallel), "MiB", mem(func(m podMemory) float64 { return m.pss })),
			only("  of which qemu", column(f.mem[0], func(m podMemory) float64 { return m.qemu })),
			only("  of which virtiofsd", column(f.mem[0], func(m podMemory) float64 { return m.virtiofsd })),
			pair("  of which the shim", "MiB", mem(func(m podMemory) float64 { return m.shim })),
			pair("  pod cgroup working set (crictl statsp)", "MiB", mem(func(m podMemory) float64 { return m.workingSet })),
		)
	}
	return out
}

// podNotes say how the pods' VMs started, why none started from a
// template, and how long the figures took.
func podNotes(fs []podFigures) []string {
	var out []string
	for _, f := range fs {
		reasons := make([]string, 0, len(f.bootReasons))
		for r, n := range f.bootReasons {
			reasons = append(reasons, fmt.Sprintf("%d: %s", n, r))
		}
		sort.Strings(reasons)
		out = append(out, fmt.Sprintf("pods on containerd %s (accel %s, channel %s): %d Cocoon VMs cold-booted (%s), %d started from a template; "+
			"a pod asking for one (io.cocoon.template=required) is refused: %s; the pod figures took %s",
			f.version, f.accel, f.channel, f.booted, strings.Join(reasons, "; "), f.cloned, f.refusal, f.took.Round(time.Second)))
	}
	if len(fs) > 0 {
		out = append(out, "no pod start from a template is measured: a pod's VM has its network namespace's NICs and a virtio-fs share "+
			"(CRI binds /etc/hosts, /etc/resolv.conf), which QEMU 7.2 cannot save (vhost-user-fs), so every pod cold-boots")
	}
	return out
}
