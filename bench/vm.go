package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cocoonrt/cocoon/runtime/admin"
	"github.com/cocoonrt/cocoon/runtime/agent"
)

type bootSamples struct {
	// ready is launch to agent ready, ms.
	ready []float64
	// total is sandbox start + `true` + stop, ms.
	total []float64
}

type memSamples struct {
	rss, pss, overhead, shared []float64
	accel, channel             string
}

// benchBoot boots n sandboxes one after another. Each one runs `true`,
// and, once idle, has its QEMU's memory read, then is stopped.
func benchBoot(ctx context.Context, env *admin.Env, n int) (bootSamples, memSamples, error) {
	var b bootSamples
	var m memSamples
	for i := 0; i < n; i++ {
		start := time.Now()
		sb, err := env.StartSandbox(ctx, "bench")
		if err != nil {
			return b, m, err
		}
		m.accel, m.channel = string(sb.Accel), string(sb.Channel)
		p, err := sb.Agent().Start(ctx, agent.ProcessSpec{ID: "true", Args: []string{"/bin/true"}, Stdout: io.Discard})
		if err == nil {
			_, err = p.Wait(ctx)
		}
		if err != nil {
			sb.Stop(context.WithoutCancel(ctx))
			return b, m, fmt.Errorf("run true: %w", err)
		}
		ran := time.Since(start)
		// Memory of an idle guest: give the guest a moment to settle
		// after boot, as a container's VM would be between requests.
		time.Sleep(500 * time.Millisecond)
		mem, err := qemuMemory(sb.VM().PID(), env.Config.Hypervisor.MemoryMiB)
		stopStart := time.Now()
		if serr := sb.Stop(context.WithoutCancel(ctx)); serr != nil && err == nil {
			err = serr
		}
		if err != nil {
			return b, m, err
		}
		b.ready = append(b.ready, ms(sb.ReadyIn))
		b.total = append(b.total, ms(ran+time.Since(stopStart)))
		m.rss = append(m.rss, mem.rss)
		m.pss = append(m.pss, mem.pss)
		m.overhead = append(m.overhead, mem.anon-mem.ramAnon)
		m.shared = append(m.shared, mem.rss-mem.anon)
	}
	return b, m, nil
}

// vmMemory is what one QEMU process holds, in MiB.
type vmMemory struct {
	// rss and pss of the whole process.
	rss, pss float64
	// anon is its anonymous memory: what no other process shares.
	anon float64
	// ramAnon is the anonymous part of the guest RAM mapping, ramPSS its
	// PSS (for a clone of a template, its private copies of pages and
	// its share of the template's memory file in the page cache).
	ramAnon, ramPSS float64
}

// qemuMemory reads a QEMU process's memory from /proc/<pid>/smaps. Guest
// RAM is the anonymous mapping of the configured memory size. The cost of
// a VM to the host beyond its guest RAM is QEMU's anonymous memory outside
// that mapping (translation cache, heap, device state); the kernel and
// initrd files, QEMU's binary and libraries are page cache that every VM
// shares, reported apart (rss - anon) and reclaimable under pressure.
func qemuMemory(pid, memMiB int) (vmMemory, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return vmMemory{}, err
	}
	var inRAM bool
	var rssKB, pssKB, anonKB, ramKB, ramPssKB int64
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") { // a mapping header
			inRAM = false
			continue
		}
		var v int64
		if len(f) >= 2 {
			v, _ = strconv.ParseInt(f[1], 10, 64)
		}
		switch f[0] {
		case "Size:":
			// Allow QEMU's alignment slack around the RAM block.
			inRAM = v >= int64(memMiB)*1024 && v <= int64(memMiB)*1024+4096
		case "Rss:":
			rssKB += v
		case "Pss:":
			pssKB += v
			if inRAM {
				ramPssKB += v
			}
		case "Anonymous:":
			anonKB += v
			if inRAM {
				ramKB += v
			}
		}
	}
	mib := func(kb int64) float64 { return float64(kb) / 1024 }
	return vmMemory{rss: mib(rssKB), pss: mib(pssKB), anon: mib(anonKB), ramAnon: mib(ramKB), ramPSS: mib(ramPssKB)}, sc.Err()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	c := append([]float64(nil), s...)
	sort.Float64s(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

func trimNL(b []byte) []byte { return bytes.TrimSpace(b) }

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
