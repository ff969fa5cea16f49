package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/sandbox"
)

// The two runtimes compared through containerd.
const (
	runtimeCocoon = "io.containerd.cocoon.v2"
	runtimeRunc   = "io.containerd.runc.v2"
)

// stdoutBytes is what the throughput figures stream: 100 MiB.
const stdoutBytes = 100 << 20

// The programs that write stdoutBytes for the throughput figures. dd
// writes 64 KiB blocks and costs next to nothing, so the figure is the
// runtime's stdout path; busybox's head -c is what a shell pipeline would
// use, and under TCG it is itself the bottleneck (it alone needs about
// 3 s for 100 MiB in the guest), so its figure shows the emulator.
var (
	ddProducer   = fmt.Sprintf("dd if=/dev/zero bs=65536 count=%d 2>/dev/null", stdoutBytes/65536)
	headProducer = fmt.Sprintf("head -c %d /dev/zero", stdoutBytes)
)

// ctrdBench drives one private containerd (Debian's 1.6) that has both
// runtimes, the busybox image imported, and a namespace of its own.
type ctrdBench struct {
	c     *harness.Containerd
	image string
	// vmStateDir is where this namespace's sandboxes keep their state
	// (<runtime.state_dir>/<namespace>): what close looks for in a
	// left-over QEMU's command line.
	vmStateDir string
	// vmDataDir holds this namespace's scratch disks
	// (<runtime.data_dir>/containers/<namespace>).
	vmDataDir string
	// live are the containers created and not yet removed.
	live map[string]bool
	// seq numbers container ids.
	seq int
}

// startCtrd starts the private containerd and imports the image. The
// caller must close it, also on error paths. stateDir and dataDir are the
// shims' runtime.state_dir and runtime.data_dir; opts may set them (and
// other COCOON_* settings) in containerd's environment, which the shims
// inherit. The shims boot every sandbox unless opts or a container's
// io.cocoon.template annotation say otherwise: the figures of cold
// starts must not turn into starts from a template made in the
// background during the run (auto mode), nor share the machine with
// that template's boot.
func startCtrd(stateDir, dataDir string, opts ...harness.Option) (*ctrdBench, error) {
	opts = append([]harness.Option{harness.WithEnv("COCOON_TEMPLATE=" + config.TemplateNever)}, opts...)
	c, err := harness.Start("1.6", opts...)
	if err != nil {
		return nil, err
	}
	c.Namespace = fmt.Sprintf("cocoon-bench-%d", os.Getpid())
	b := &ctrdBench{
		c:          c,
		vmStateDir: filepath.Join(stateDir, c.Namespace),
		vmDataDir:  filepath.Join(dataDir, sandbox.ContainersDirName, c.Namespace),
		live:       map[string]bool{},
	}
	if b.image, err = harness.Import(c); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// close removes every container left, stops containerd and its shims,
// and kills any QEMU of this namespace that outlived its shim.
func (b *ctrdBench) close() {
	for id := range b.live {
		b.remove(id)
	}
	if err := b.c.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
	}
	for _, pid := range pidsWithArg(b.vmStateDir + "/") {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// The namespace is this run's own: nothing else is in these.
	_ = os.RemoveAll(b.vmStateDir)
	_ = os.RemoveAll(b.vmDataDir)
}

// newID returns a fresh container id and records it as live.
func (b *ctrdBench) newID(prefix string) string {
	b.seq++
	id := fmt.Sprintf("%s-%d", prefix, b.seq)
	b.live[id] = true
	return id
}

// remove kills and deletes container id, whatever state it is in. It
// must work after the bench's context was cancelled.
// Each step is bounded: a shim that does not answer is killed by close.
func (b *ctrdBench) remove(id string) {
	for _, args := range [][]string{
		{"task", "kill", "-s", "SIGKILL", id},
		{"task", "delete", "-f", id},
		{"container", "delete", id},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_ = b.ctr(ctx, io.Discard, args...)
		cancel()
	}
	delete(b.live, id)
}

// ctr runs ctr bound to ctx and returns its error with stderr.
func (b *ctrdBench) ctr(ctx context.Context, stdout io.Writer, args ...string) error {
	var stderr strings.Builder
	cmd := b.c.CtrCommand(ctx, args...)
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// startLatency times `ctr run --rm --runtime rt <image> id true`, n times.
func (b *ctrdBench) startLatency(ctx context.Context, rt string, n int) ([]float64, error) {
	var out []float64
	for i := 0; i < n; i++ {
		id := b.newID("start")
		start := time.Now()
		if err := b.ctr(ctx, io.Discard, "run", "--rm", "--runtime", rt, b.image, id, "true"); err != nil {
			return out, err
		}
		out = append(out, ms(time.Since(start)))
		delete(b.live, id) // --rm removed it
	}
	return out, nil
}

// startTiming is the shim's account of one container's Create, Start and
// Delete (its "container timing" log line), in ms.
type startTiming struct{ calls, vm, guest, shim float64 }

// timingLine matches the shim's "container timing" line and its fields.
var (
	timingLine  = regexp.MustCompile(`msg="container timing"(.*)`)
	timingField = regexp.MustCompile(`(\w+)=(\S+)`)
)

// timings reads the shim's timing of the containers whose ids start with
// prefix from containerd's log (where the shim's log lines go). The shim
// writes the line before its Delete returns; containerd copies it into
// its log a moment later.
func (b *ctrdBench) timings(prefix string, want int) ([]startTiming, error) {
	return waitLog(b, "shim timing lines for "+prefix+"*", want, func(lines []string) ([]startTiming, error) {
		var out []startTiming
		for _, line := range lines {
			m := timingLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			f := logFields(m[1])
			if !strings.HasPrefix(f["container"], prefix) {
				continue
			}
			num := func(k string) float64 { v, _ := strconv.ParseFloat(f[k], 64); return v }
			out = append(out, startTiming{calls: num("calls_ms"), vm: num("vm_ms"), guest: num("guest_ms"), shim: num("shim_ms")})
		}
		return out, nil
	})
}

// waitLog waits (2 s at most) until collect finds want entries in the
// lines of containerd's log, where the shims' log lines go: a shim
// writes a line before its call returns, and containerd copies it into
// its log a moment later. what names the entries in the error.
func waitLog[T any](b *ctrdBench, what string, want int, collect func(lines []string) ([]T, error)) ([]T, error) {
	var out []T
	for wait := 0; ; wait++ {
		var err error
		if out, err = collect(strings.Split(b.c.Log(), "\n")); err != nil {
			return nil, err
		}
		if len(out) >= want || wait == 20 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(out) < want {
		return out, fmt.Errorf("containerd's log has %d %s, want %d", len(out), what, want)
	}
	return out, nil
}

// running is a detached container running `sleep`.
type running struct{ id string }

func (b *ctrdBench) runDetached(ctx context.Context, rt string) (running, error) {
	id := b.newID("idle")
	err := b.ctr(ctx, io.Discard, "run", "-d", "--runtime", rt, b.image, id, "sleep", "3600")
	return running{id: id}, err
}

// execLatency times `ctr task exec --exec-id eN <id> true`, n times, in r.
func (b *ctrdBench) execLatency(ctx context.Context, r running, n int) ([]float64, error) {
	var out []float64
	for i := 0; i < n; i++ {
		start := time.Now()
		if err := b.ctr(ctx, io.Discard, "task", "exec", "--exec-id", fmt.Sprintf("e%d", i), r.id, "true"); err != nil {
			return out, err
		}
		out = append(out, ms(time.Since(start)))
	}
	return out, nil
}

// throughput streams stdoutBytes from producer (a shell command) in a
// new container through ctr's stdout into the bench, n times, and returns
// MB/s (10^6 bytes) from the first byte to the end of the stream: the
// stdio path, not the boot.
func (b *ctrdBench) throughput(ctx context.Context, rt, producer string, n int) ([]float64, error) {
	var out []float64
	for i := 0; i < n; i++ {
		id := b.newID("stdout")
		cmd := b.c.CtrCommand(ctx, "run", "--rm", "--runtime", rt, b.image, id,
			"sh", "-c", producer)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		pipe, err := cmd.StdoutPipe()
		if err != nil {
			return out, err
		}
		if err := cmd.Start(); err != nil {
			return out, err
		}
		c := &firstByteCounter{}
		_, copyErr := io.CopyBuffer(c, pipe, make([]byte, 1<<20))
		end := time.Now()
		if err := cmd.Wait(); err != nil {
			return out, fmt.Errorf("ctr run %s: %w: %s", id, err, strings.TrimSpace(stderr.String()))
		}
		if copyErr != nil {
			return out, copyErr
		}
		delete(b.live, id)
		if c.n != stdoutBytes {
			return out, fmt.Errorf("stdout of %s: %d bytes, want %d", rt, c.n, stdoutBytes)
		}
		out = append(out, float64(c.n)/end.Sub(c.first).Seconds()/1e6)
	}
	return out, nil
}

// firstByteCounter discards what it is given, counting the bytes and
// noting when the first arrived.
type firstByteCounter struct {
	n     int64
	first time.Time
}

func (c *firstByteCounter) Write(p []byte) (int, error) {
	if c.n == 0 && len(p) > 0 {
		c.first = time.Now()
	}
	c.n += int64(len(p))
	return len(p), nil
}

// ctrMemory is what one running container costs the host, in MiB.
type ctrMemory struct {
	// shimRSS is the shim's own RSS.
	shimRSS float64
	// rss and pss of the shim plus what runs the container: QEMU for
	// Cocoon, the container's processes for runc.
	rss, pss float64
	// overhead is QEMU's anonymous memory outside guest RAM (Cocoon only).
	overhead float64
}

// memory reads what the only running container (of runtime rt) costs:
// its shim and the shim's descendants.
func (b *ctrdBench) memory(rt string, guestMiB int) (ctrMemory, error) {
	bin := harness.ShimBinary
	if rt == runtimeRunc {
		bin = harness.RuncShimBinary
	}
	shims := harness.ShimPIDsOf(bin, b.c.Address)
	if len(shims) != 1 {
		return ctrMemory{}, fmt.Errorf("%d %s shims running, want 1", len(shims), bin)
	}
	var m ctrMemory
	shim, err := rollup(shims[0])
	if err != nil {
		return m, err
	}
	m.shimRSS, m.rss, m.pss = shim.rss, shim.rss, shim.pss
	for _, pid := range descendants(shims[0]) {
		if strings.HasPrefix(comm(pid), "qemu-system") {
			q, err := qemuMemory(pid, guestMiB)
			if err != nil {
				return m, err
			}
			m.rss += q.rss
			m.pss += q.pss
			m.overhead += q.anon - q.ramAnon
			continue
		}
		p, err := rollup(pid)
		if errors.Is(err, os.ErrNotExist) {
			continue // exited meanwhile
		}
		if err != nil {
			return m, err
		}
		m.rss += p.rss
		m.pss += p.pss
	}
	return m, nil
}

// rollup reads a process's RSS and PSS from /proc/<pid>/smaps_rollup.
func rollup(pid int) (vmMemory, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return vmMemory{}, err
	}
	var m vmMemory
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "Rss:":
			m.rss = v / 1024
		case "Pss:":
			m.pss = v / 1024
		case "Anonymous:":
			m.anon = v / 1024
		}
	}
	return m, nil
}

// procs lists every pid with its parent.
func procs() map[int]int {
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command name may hold spaces: fields start after its ')'.
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 {
			parent[pid], _ = strconv.Atoi(f[1])
		}
	}
	return parent
}

// descendants lists the processes below pid.
func descendants(pid int) []int {
	parent := procs()
	var out []int
	want := map[int]bool{pid: true}
	for changed := true; changed; {
		changed = false
		for p, pp := range parent {
			if want[pp] && !want[p] {
				want[p], changed = true, true
				out = append(out, p)
			}
		}
	}
	return out
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// pidsWithArg lists processes one of whose arguments contains s.
func pidsWithArg(s string) []int {
	var out []int
	for pid := range procs() {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(cmdline), s) {
			out = append(out, pid)
		}
	}
	return out
}

// ctrdFigures are the containerd figures of both runtimes.
type ctrdFigures struct {
	start, exec, stdout [2][]float64
	// startTimings are the shim's accounts of Cocoon's starts.
	startTimings []startTiming
	// stdoutHead is stdout with busybox's head -c as the producer.
	stdoutHead        [2][]float64
	shimRSS, rss, pss [2][]float64
	overhead          []float64
	// deleteAfter are the deletes of containers that wrote
	// copyBackMiB[k] MiB, at [runtime][k].
	deleteAfter [2][][]float64
	// checkpoints are the checkpoint and restore figures.
	checkpoints ckptFigures
	// execUser are the starts with and without the exec user.
	execUser execUserFigures
}

// benchContainerd measures both runtimes through one private containerd:
// n starts, n execs, 3 stdout streams and 3 running containers' memory
// each. Index 0 is Cocoon, 1 runc.
func benchContainerd(ctx context.Context, cfg *config.Config, n int) (f ctrdFigures, retErr error) {
	guestMiB := cfg.Hypervisor.MemoryMiB
	b, err := startCtrd(cfg.Runtime.StateDir, cfg.Runtime.DataDir)
	if err != nil {
		return f, err
	}
	defer b.close()
	if f.checkpoints, err = b.checkpointFigures(ctx); err != nil {
		return f, err
	}
	for i, rt := range []string{runtimeCocoon, runtimeRunc} {
		if f.start[i], err = b.startLatency(ctx, rt, n); err != nil {
			return f, err
		}
		if rt == runtimeCocoon {
			if f.startTimings, err = b.timings("start-", n); err != nil {
				return f, err
			}
			if f.execUser, err = b.execUserFigures(ctx, n); err != nil {
				return f, err
			}
		}
		if f.stdout[i], err = b.throughput(ctx, rt, ddProducer, 3); err != nil {
			return f, err
		}
		if f.stdoutHead[i], err = b.throughput(ctx, rt, headProducer, 3); err != nil {
			return f, err
		}
		for _, mib := range copyBackMiB {
			d, err := b.deleteAfterWrites(ctx, rt, mib, copyBackSamples)
			if err != nil {
				return f, err
			}
			f.deleteAfter[i] = append(f.deleteAfter[i], d)
		}
		for k := 0; k < 3; k++ {
			r, err := b.runDetached(ctx, rt)
			if err != nil {
				return f, err
			}
			// Idle, as a container between requests.
			select {
			case <-ctx.Done():
				return f, ctx.Err()
			case <-time.After(time.Second):
			}
			m, err := b.memory(rt, guestMiB)
			if err != nil {
				return f, err
			}
			f.shimRSS[i] = append(f.shimRSS[i], m.shimRSS)
			f.rss[i] = append(f.rss[i], m.rss)
			f.pss[i] = append(f.pss[i], m.pss)
			if rt == runtimeCocoon {
				f.overhead = append(f.overhead, m.overhead)
			}
			if k == 0 {
				if f.exec[i], err = b.execLatency(ctx, r, n); err != nil {
					return f, err
				}
			}
			b.remove(r.id)
		}
	}
	return f, nil
}
