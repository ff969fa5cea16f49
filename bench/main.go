// Command bench measures Cocoon on this machine, next to runc in the same
// run: cold boot to agent-ready, a command run end to end, and the host
// memory each VM costs. It writes bench/results/latest.json and prints a
// table of medians. Run it with `make bench` (root).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
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
}

// Host describes the machine.
type Host struct {
	CPUs   int    `json:"cpus"`
	Kernel string `json:"kernel"`
	Model  string `json:"cpu_model"`
}

func main() {
	out := flag.String("out", "bench/results/latest.json", "where to write the JSON report")
	n := flag.Int("n", 7, "samples per figure (at least 5)")
	flag.Parse()
	if *n < 5 {
		fmt.Fprintln(os.Stderr, "bench: -n must be at least 5")
		os.Exit(2)
	}
	if err := run(context.Background(), *out, *n); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out string, n int) error {
	// The table is the output; the runtime's info lines would bury it.
	if err := log.SetLevel("warn"); err != nil {
		return err
	}
	env, err := admin.LoadEnv("")
	if err != nil {
		return err
	}
	rep := Report{Version: version.Version, Time: time.Now().UTC(), Host: hostInfo()}

	boot, mem, err := benchBoot(ctx, env, n)
	if err != nil {
		return err
	}
	rep.Accel, rep.Channel = mem.accel, mem.channel
	runcStart, runcErr := benchRunc(ctx, n)
	if runcErr != nil {
		rep.RuncNote = "runc baseline not measured: " + runcErr.Error()
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
			Runc: runcMedian(runcStart)},
		Result{Name: "qemu rss per idle vm", Unit: "MiB", Median: median(mem.rss), Samples: mem.rss},
		Result{Name: "qemu pss per idle vm", Unit: "MiB", Median: median(mem.pss), Samples: mem.pss},
		Result{Name: "host memory outside guest ram per vm", Unit: "MiB", Median: median(mem.overhead), Samples: mem.overhead,
			Target: "<= 40 MiB"},
		Result{Name: "page cache shared by all vms (kernel, initrd, qemu)", Unit: "MiB", Median: median(mem.shared), Samples: mem.shared},
	)

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
	fmt.Printf("%-52s %12s %12s %8s  %s\n", "figure", "cocoon", "runc", "ratio", "target")
	for _, r := range rep.Results {
		runc, ratio := "-", "-"
		if r.Runc != nil {
			runc = fmt.Sprintf("%.1f %s", *r.Runc, r.Unit)
			if *r.Runc > 0 {
				ratio = fmt.Sprintf("%.1fx", r.Median / *r.Runc)
			}
		}
		fmt.Printf("%-52s %12s %12s %8s  %s\n", r.Name, fmt.Sprintf("%.1f %s", r.Median, r.Unit), runc, ratio, r.Target)
	}
	if rep.RuncNote != "" {
		fmt.Println("\n" + rep.RuncNote)
	}
}
