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
	rss, pss, overhead []float64
	accel, channel     string
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
			sb.Stop(ctx)
			return b, m, fmt.Errorf("run true: %w", err)
		}
		ran := time.Since(start)
		// Memory of an idle guest: give the guest a moment to settle
		// after boot, as a container's VM would be between requests.
		time.Sleep(500 * time.Millisecond)
		rss, pss, ram, err := qemuMemory(sb.VM().PID(), env.Config.Hypervisor.MemoryMiB)
		stopStart := time.Now()
		if serr := sb.Stop(ctx); serr != nil && err == nil {
			err = serr
		}
		if err != nil {
			return b, m, err
		}
		b.ready = append(b.ready, ms(sb.ReadyIn))
		b.total = append(b.total, ms(ran+time.Since(stopStart)))
		m.rss = append(m.rss, rss)
		m.pss = append(m.pss, pss)
		m.overhead = append(m.overhead, rss-ram)
	}
	return b, m, nil
}

// qemuMemory reads a QEMU process's RSS and PSS and the resident part of
// its guest RAM mapping, in MiB. Guest RAM is the anonymous mapping of the
// configured memory size; what QEMU holds beyond it is the overhead that a
// VM costs the host outside guest RAM.
func qemuMemory(pid, memMiB int) (rss, pss, ram float64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	var inRAM bool
	var rssKB, pssKB, ramKB int64
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") { // a mapping header
			inRAM = false
			continue
		}
		val := func() int64 {
			if len(f) < 2 {
				return 0
			}
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
		switch f[0] {
		case "Size:":
			// Allow QEMU's alignment slack around the RAM block.
			sz := val()
			inRAM = sz >= int64(memMiB)*1024 && sz <= int64(memMiB)*1024+4096
		case "Rss:":
			rssKB += val()
			if inRAM {
				ramKB += val()
			}
		case "Pss:":
			pssKB += val()
		}
	}
	return float64(rssKB) / 1024, float64(pssKB) / 1024, float64(ramKB) / 1024, sc.Err()
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
