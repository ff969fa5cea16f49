// Command bench measures Cocoon on this machine, next to runc in the same
// run: cold boot to agent-ready, a command run end to end, and the host
// memory each VM costs, and the same of sandboxes started from a template
// next to cold boots, TCP throughput and HTTP latency through nerdctl's
// bridge networking, and Kubernetes pods through crictl and containerd's
// CRI: their start, serial and ten at once, and their memory. It writes bench/results/latest.json and prints a
// table of medians. Run it with `make bench` (root).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/admin"
	"github.com/cocoonrt/cocoon/runtime/version"
)

// Result is one measured figure.
type Result struct {
	// Name says what was measured.
	Name string `json:"name"`
	// Unit of Median and Samples.
	Unit string `json:"unit"`
	// Median of Samples.
	Median float64 `json:"median"`
	// Samples as measured, in order.
	Samples []float64 `json:"samples"`
	// Runc is the same figure for runc, where one exists.
	Runc *float64 `json:"runc_median,omitempty"`
	// RuncSamples are runc's samples, where measured in this run.
	RuncSamples []float64 `json:"runc_samples,omitempty"`
	// Target is the figure the project aims for on this machine, if any.
	Target string `json:"target,omitempty"`
}

// Report is what latest.json holds.
type Report struct {
	Version  string    `json:"version"`
	Time     time.Time `json:"time"`
	Host     Host      `json:"host"`
	Accel    string    `json:"accel"`
	Channel  string    `json:"channel"`
	Results  []Result  `json:"results"`
	RuncNote string    `json:"runc_note,omitempty"`
	// Notes say what the figures are not, or how they came about.
	Notes []string `json:"notes,omitempty"`
}

// Host describes the machine.
type Host struct {
	CPUs   int    `json:"cpus"`
	Kernel string `json:"kernel"`
	Model  string `json:"cpu_model"`
}

func main() {
	out := flag.String("out", "bench/results/latest.json", "where to write the JSON report")
	n := flag.Int("n", 7, "samples per boot and memory figure (at least 5)")
	ctrN := flag.Int("ctr-n", 10, "samples per containerd start and exec figure (at least 10)")
	podN := flag.Int("pod-n", 5, "serial pod starts per runtime and containerd version (at least 5)")
	only := flag.String("only", "", `measure only these figures: "copyback" (the deletes after writes), "checkpoint", "template", "execuser", "network", "pod", "docker"`)
	flag.Parse()
	switch *only {
	case "", "copyback", "checkpoint", "template", "execuser", "network", "pod", "docker":
	default:
		fmt.Fprintln(os.Stderr, `bench: -only takes "copyback", "checkpoint", "template", "execuser", "network", "pod" or "docker"`)
		os.Exit(2)
	}
	if *n < 5 || *ctrN < 10 || *podN < 5 {
		fmt.Fprintln(os.Stderr, "bench: -n and -pod-n must be at least 5, -ctr-n at least 10")
		os.Exit(2)
	}
	// ^C or SIGTERM cancels the run; what it started is still cleaned up
	// before exiting.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *out, counts{boot: *n, ctr: *ctrN, pod: *podN}, *only)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// counts are how many samples the figures take: boot and memory
// figures, containerd starts and execs, serial pod starts.
type counts struct{ boot, ctr, pod int }

func run(ctx context.Context, out string, cnt counts, only string) error {
	n, ctrN := cnt.boot, cnt.ctr
	// The table is the output; the runtime's info lines would bury it.
	if err := log.SetLevel("warn"); err != nil {
		return err
	}
	env, err := admin.LoadEnv("")
	if err != nil {
		return err
	}
	rep := Report{Version: version.Version, Time: time.Now().UTC(), Host: hostInfo()}
	if only == "copyback" {
		f, err := benchCopyBackOnly(ctx, &env.Config)
		if err != nil {
			return fmt.Errorf("copy back figures: %w", err)
		}
		rep.Results = copyBackResults(f)
		return writeReport(rep, out)
	}
	if only == "checkpoint" {
		f, err := benchCheckpointOnly(ctx, &env.Config)
		if err != nil {
			return fmt.Errorf("checkpoint figures: %w", err)
		}
		rep.Results = checkpointResults(f)
		if f.runcErr != nil {
			rep.RuncNote = "runc checkpoint figures not measured: " + f.runcErr.Error()
		}
		return writeReport(rep, out)
	}
	if only == "execuser" {
		f, err := benchExecUserOnly(ctx, &env.Config, ctrN)
		if err != nil {
			return fmt.Errorf("exec user figures: %w", err)
		}
		rep.Results = execUserResults(f)
		return writeReport(rep, out)
	}
	if only == "network" {
		f, err := benchNetwork(ctx, &env.Config)
		if err != nil {
			return fmt.Errorf("network figures: %w", err)
		}
		rep.Accel, rep.Channel = f.accel, f.channel
		rep.Results = netResults(f)
		return writeReport(rep, out)
	}
	if only == "pod" {
		fs, err := benchPods(ctx, cnt.pod)
		if err != nil {
			return fmt.Errorf("pod figures: %w", err)
		}
		if len(fs) > 0 {
			rep.Accel, rep.Channel = fs[0].accel, fs[0].channel
		}
		rep.Results, rep.Notes = podResults(fs), podNotes(fs)
		return writeReport(rep, out)
	}
	if only == "docker" {
		f, err := benchDocker(ctx, &env.Config, ctrN)
		if err != nil {
			return fmt.Errorf("docker figures: %w", err)
		}
		rep.Results = dockerResults(f)
		return writeReport(rep, out)
	}
	if only == "template" {
		f, err := benchTemplate(ctx, env, n, ctrN)
		if err != nil {
			return fmt.Errorf("template figures: %w", err)
		}
		rep.Accel, rep.Channel = f.accel, f.channel
		rep.Results = templateResults(f)
		return writeReport(rep, out)
	}

	boot, mem, err := benchBoot(ctx, env, n)
	if err != nil {
		return err
	}
	rep.Accel, rep.Channel = mem.accel, mem.channel
	runcStart, runcErr := benchRunc(ctx, n)
	if runcErr != nil {
		rep.RuncNote = "runc baseline not measured: " + runcErr.Error()
	}
	ctrd, err := benchContainerd(ctx, &env.Config, ctrN)
	if err != nil {
		return fmt.Errorf("containerd figures: %w", err)
	}
	runcMedian := func(s []float64) *float64 {
		if runcErr != nil {
			return nil
		}
		m := median(s)
		return &m
	}
	rep.Results = append(rep.Results,
		Result{Name: "cold boot to agent ready", Unit: "ms", Median: median(boot.ready), Samples: boot.ready,
			Target: "<= 1500 ms (TCG), <= 150 ms (KVM)"},
		Result{Name: "run `true` in a new sandbox, end to end", Unit: "ms", Median: median(boot.total), Samples: boot.total,
			Runc: runcMedian(runcStart), RuncSamples: runcStart},
		Result{Name: "qemu rss per idle vm", Unit: "MiB", Median: median(mem.rss), Samples: mem.rss},
		Result{Name: "qemu pss per idle vm", Unit: "MiB", Median: median(mem.pss), Samples: mem.pss},
		Result{Name: "host memory outside guest ram per vm", Unit: "MiB", Median: median(mem.overhead), Samples: mem.overhead,
			Target: "<= 40 MiB"},
		Result{Name: "page cache shared by all vms (kernel, initrd, qemu)", Unit: "MiB", Median: median(mem.shared), Samples: mem.shared},
	)
	rep.Results = append(rep.Results, ctrdResults(ctrd, median(boot.ready))...)
	rep.Results = append(rep.Results, execUserResults(ctrd.execUser)...)
	rep.Results = append(rep.Results, checkpointResults(ctrd.checkpoints)...)
	if ctrd.checkpoints.runcErr != nil {
		rep.RuncNote = strings.TrimSpace(rep.RuncNote + "\nrunc checkpoint figures not measured: " + ctrd.checkpoints.runcErr.Error())
	}
	tmpl, err := benchTemplate(ctx, env, n, ctrN)
	if err != nil {
		return fmt.Errorf("template figures: %w", err)
	}
	rep.Results = append(rep.Results, templateResults(tmpl)...)
	nets, err := benchNetwork(ctx, &env.Config)
	if err != nil {
		return fmt.Errorf("network figures: %w", err)
	}
	rep.Results = append(rep.Results, netResults(nets)...)
	dockerFigs, err := benchDocker(ctx, &env.Config, ctrN)
	if err != nil {
		return fmt.Errorf("docker figures: %w", err)
	}
	rep.Results = append(rep.Results, dockerResults(dockerFigs)...)
	pods, err := benchPods(ctx, cnt.pod)
	if err != nil {
		return fmt.Errorf("pod figures: %w", err)
	}
	rep.Results = append(rep.Results, podResults(pods)...)
	rep.Notes = append(rep.Notes, podNotes(pods)...)
	return writeReport(rep, out)
}

// writeReport writes rep to out as JSON and prints its table.
func writeReport(rep Report, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	printTable(rep)
	fmt.Printf("\nwritten to %s\n", out)
	return nil
}

// ctrdResults are the containerd figures, Cocoon next to runc.
func ctrdResults(f ctrdFigures, bootReady float64) []Result {
	pair := func(name, unit string, s [2][]float64, target string) Result {
		r := median(s[1])
		return Result{Name: name, Unit: unit, Median: median(s[0]), Samples: s[0], Runc: &r, RuncSamples: s[1], Target: target}
	}
	start := median(f.start[0])
	overhead := []float64{start - bootReady}
	beyondRunc := []float64{start - median(f.start[1]) - bootReady}
	return append([]Result{
		pair("ctr run --rm true (container start)", "ms", f.start, ""),
		{Name: "  beyond vm boot (start - boot: guest, shim, containerd)", Unit: "ms", Median: overhead[0], Samples: overhead},
		{Name: "  start - runc start - vm boot", Unit: "ms", Median: beyondRunc[0], Samples: beyondRunc},
		timingResult("  the shim's own host work (its calls - vm - guest)", f.startTimings, func(t startTiming) float64 { return t.shim }, "<= 50 ms"),
		timingResult("  guest agent calls (create, start, flush: crun in the guest)", f.startTimings, func(t startTiming) float64 { return t.guest }, ""),
		timingResult("  vm boot and stop inside the shim's calls", f.startTimings, func(t startTiming) float64 { return t.vm }, ""),
		pair("ctr task exec true (exec)", "ms", f.exec, ""),
		pair("stdout throughput, 100 MiB via ctr (dd, 64 KiB writes)", "MB/s", f.stdout, ">= 100 MB/s"),
		pair("  the same from busybox head -c (producer-bound under TCG)", "MB/s", f.stdoutHead, ""),
		pair("shim rss per running container", "MiB", f.shimRSS, "<= 20 MiB"),
		pair("shim + qemu (runc: + container) rss", "MiB", f.rss, ""),
		pair("shim + qemu (runc: + container) pss", "MiB", f.pss, ""),
		{Name: "qemu anon outside guest ram (via containerd)", Unit: "MiB", Median: median(f.overhead), Samples: f.overhead,
			Target: "<= 40 MiB"},
	}, copyBackResults(f)...)
}

func hostInfo() Host {
	h := Host{CPUs: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = string(trimNL(b))
	}
	h.Model = cpuModel()
	return h
}

func printTable(rep Report) {
	fmt.Printf("cocoon %s on %d cpus (%s), accel %s, channel %s\n\n", rep.Version, rep.Host.CPUs, rep.Host.Model, rep.Accel, rep.Channel)
	fmt.Printf("%-52s %12s %12s %8s  %s\n", "figure (median)", "cocoon", "runc", "ratio", "target")
	for _, r := range rep.Results {
		runc, ratio := "-", "-"
		if r.Runc != nil {
			runc = fmt.Sprintf("%.1f %s", *r.Runc, r.Unit)
			if *r.Runc > 0 {
				ratio = fmt.Sprintf("%.3gx", r.Median / *r.Runc)
			}
		}
		fmt.Printf("%-52s %12s %12s %8s  %s\n", r.Name, fmt.Sprintf("%.1f %s", r.Median, r.Unit), runc, ratio, r.Target)
	}
	if rep.RuncNote != "" {
		fmt.Println("\n" + rep.RuncNote)
	}
	for _, n := range rep.Notes {
		fmt.Println("\nnote: " + n)
	}
}

// timingResult is one part of the shim's account of Cocoon's starts.
func timingResult(name string, ts []startTiming, part func(startTiming) float64, target string) Result {
	s := make([]float64, len(ts))
	for i, t := range ts {
		s[i] = part(t)
	}
	return Result{Name: name, Unit: "ms", Median: median(s), Samples: s, Target: target}
}
