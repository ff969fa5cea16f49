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
	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/admin"
	"github.com/cocoonrt/cocoon/runtime/agent"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/sandbox"
)

// tmplMemSandboxes is how many running sandboxes of each kind the
// template memory figure holds at once.
const tmplMemSandboxes = 10

// tmplSettle is how long the running sandboxes idle before their memory
// is read.
const tmplSettle = 3 * time.Second

// tmplFigures are the template figures: [0] booted, [1] from the template
// (and [2] runc where there is one).
type tmplFigures struct {
	// ready is the sandbox's ReadyIn (launch to agent ready) and call the
	// whole start call (lookup and verification of the template, image
	// verification, state directory, launch, ready), in ms, through the
	// runtime API; the two kinds alternate.
	ready, call [2][]float64
	// create is CreateTemplate's wall time, ms.
	create float64
	// ctrStart is `ctr run --rm <image> true` in ms, the three
	// alternating.
	ctrStart [3][]float64
	// launches are the shim's accounts of those starts (its
	// "sandbox booted" and "sandbox started from template" lines).
	launches [2][]launch
	// timings are the shim's accounts of those starts.
	timings [2][]startTiming
	// mem are the running sandboxes' memory figures.
	mem            [2]tmplMem
	accel, channel string
}

// The template modes the containerd figures ask for per container.
var tmplModes = [2]string{config.TemplateNever, config.TemplateRequired}

// benchTemplate measures sandboxes started from a template next to cold
// boots, all in data and state directories of its own: it makes the
// template of the configured shape, starts n sandboxes of each kind
// through the runtime API, n containers of each kind and of runc through
// one private containerd, and then holds tmplMemSandboxes running
// sandboxes of each kind in turn and reads their memory.
func benchTemplate(ctx context.Context, env *admin.Env, n, ctrN int) (f tmplFigures, retErr error) {
	// Short: the template's sandbox has its sockets in
	// <root>/run/cocoon.templates/template-<key>/, within the 108 bytes
	// of a unix socket's path.
	root, err := os.MkdirTemp("", "cbtmpl")
	if err != nil {
		return f, err
	}
	defer func() {
		// Any process of this run's directories left behind.
		for _, pid := range pidsWithArg(root + "/") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if err := os.RemoveAll(root); err != nil && retErr == nil {
			retErr = err
		}
	}()
	e := *env
	e.Config.Runtime.StateDir = filepath.Join(root, "run")
	e.Config.Runtime.DataDir = filepath.Join(root, "lib")
	e.Config.Template.Mode = config.TemplateRequired
	for _, d := range []string{e.Config.Runtime.StateDir, e.Config.Runtime.DataDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return f, err
		}
	}
	began := time.Now()
	if err := e.CreateTemplate(ctx, io.Discard, admin.TemplateOptions{}); err != nil {
		return f, fmt.Errorf("create the template: %w", err)
	}
	f.create = ms(time.Since(began))
	if err := f.startFigures(ctx, &e, n); err != nil {
		return f, err
	}
	// The shims' default is a boot (and no template made in the
	// background); each container says which it wants.
	b, err := startCtrd(e.Config.Runtime.StateDir, e.Config.Runtime.DataDir, harness.WithEnv(
		"COCOON_STATE_DIR="+e.Config.Runtime.StateDir,
		"COCOON_DATA_DIR="+e.Config.Runtime.DataDir,
		"COCOON_TEMPLATE="+config.TemplateNever,
	))
	if err != nil {
		return f, err
	}
	defer b.close()
	if err := b.tmplStartFigures(ctx, &f, ctrN); err != nil {
		return f, err
	}
	for k, mode := range tmplModes {
		if f.mem[k], err = b.tmplMemory(ctx, mode, e.Config.Hypervisor.MemoryMiB); err != nil {
			return f, err
		}
	}
	return f, nil
}

// startFigures starts n sandboxes of each kind through the runtime API,
// alternating, the kind that goes first swapping each round so that a
// drift of the host's speed weighs on both alike.
func (f *tmplFigures) startFigures(ctx context.Context, e *admin.Env, n int) error {
	for i := 0; i < n; i++ {
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, k := range order {
			ready, call, err := f.startOnce(ctx, e, k == 1)
			if err != nil {
				return err
			}
			f.ready[k] = append(f.ready[k], ready)
			f.call[k] = append(f.call[k], call)
		}
	}
	return nil
}

// startOnce starts one sandbox, booted or from the template, runs `true`
// in it (a clone must work, not only answer) and stops it.
func (f *tmplFigures) startOnce(ctx context.Context, e *admin.Env, clone bool) (ready, call float64, retErr error) {
	began := time.Now()
	var sb *sandbox.Sandbox
	var err error
	if clone {
		var use sandbox.TemplateUse
		sb, use, err = e.StartSandboxWithTemplate(ctx, "bench-clone")
		if err == nil && !use.Used {
			err = fmt.Errorf("the sandbox booted: %s", use.Why)
			_ = sb.Stop(context.WithoutCancel(ctx))
		}
	} else {
		sb, err = e.StartSandbox(ctx, "bench-cold")
	}
	if err != nil {
		return 0, 0, err
	}
	call = ms(time.Since(began))
	f.accel, f.channel = string(sb.Accel), string(sb.Channel)
	defer func() {
		if err := sb.Stop(context.WithoutCancel(ctx)); err != nil && retErr == nil {
			retErr = err
		}
	}()
	p, err := sb.Agent().Start(ctx, agent.ProcessSpec{ID: "true", Args: []string{"/bin/true"}, Stdout: io.Discard})
	if err == nil {
		_, err = p.Wait(ctx)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("run true (template %v): %w", clone, err)
	}
	return ms(sb.ReadyIn), call, nil
}

// tmplStartFigures times ctrN runs of `ctr run --rm <image> true` booted,
// from the template and with runc, in turn (the order rotating each
// round), after one run of each that is not counted: the first of a
// kind fills the layer cache of this data directory or verifies the
// template's files.
func (b *ctrdBench) tmplStartFigures(ctx context.Context, f *tmplFigures, ctrN int) error {
	kinds := [3]struct{ prefix, rt, mode string }{
		{"tcold", runtimeCocoon, tmplModes[0]},
		{"tclone", runtimeCocoon, tmplModes[1]},
		{"trunc", runtimeRunc, ""},
	}
	run := func(k int, prefix string) (float64, error) {
		args := []string{"run", "--rm", "--runtime", kinds[k].rt}
		if kinds[k].mode != "" {
			args = append(args, "--annotation", oci.AnnotationTemplate+"="+kinds[k].mode)
		}
		id := b.newID(prefix)
		start := time.Now()
		if err := b.ctr(ctx, io.Discard, append(args, b.image, id, "true")...); err != nil {
			return 0, err
		}
		delete(b.live, id) // --rm removed it
		return ms(time.Since(start)), nil
	}
	for k := range kinds {
		if _, err := run(k, "warm"); err != nil {
			return err
		}
	}
	for i := 0; i < ctrN; i++ {
		for j := range kinds {
			k := (i + j) % len(kinds)
			d, err := run(k, kinds[k].prefix)
			if err != nil {
				return err
			}
			f.ctrStart[k] = append(f.ctrStart[k], d)
		}
	}
	for k := 0; k < 2; k++ {
		var err error
		if f.launches[k], err = b.launches(kinds[k].prefix+"-", k == 1, ctrN); err != nil {
			return err
		}
		if f.timings[k], err = b.timings(kinds[k].prefix+"-", ctrN); err != nil {
			return err
		}
	}
	return nil
}

// launchLine matches the shim's line of a sandbox's start, connLine its
// debug line of the agent's connection.
var (
	launchLine = regexp.MustCompile(`msg="sandbox (booted|started from template)"(.*)`)
	connLine   = regexp.MustCompile(`msg="agent connected"(.*)`)
)

// launch is the shim's account of one sandbox's start, in ms: launch to
// ready, and of that the agent's connection: the dial, the handshake
// (after a boot: the boot itself) and the first call (the guest's sync of
// clock, entropy and hostname). The rest is the VMM's launch (after
// a state load for a clone).
type launch struct{ ready, dial, handshake, sync float64 }

// launches reads the shim's account of the starts of the sandboxes whose
// ids start with prefix from containerd's log, and checks that each
// started from a template if clone, and booted if not.
func (b *ctrdBench) launches(prefix string, clone bool, want int) ([]launch, error) {
	return waitLog(b, "sandbox start lines for "+prefix+"*", want, func(lines []string) ([]launch, error) {
		var out []launch
		conn := map[string]map[string]string{}
		for _, line := range lines {
			if m := connLine.FindStringSubmatch(line); m != nil {
				f := logFields(m[1])
				conn[f["sandbox"]] = f
				continue
			}
			m := launchLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			f := logFields(m[2])
			id := f["sandbox"]
			if !strings.HasPrefix(id, prefix) {
				continue
			}
			if fromTemplate := m[1] != "booted"; fromTemplate != clone {
				return nil, fmt.Errorf("sandbox %s: the shim says %q (key %s)", id, "sandbox "+m[1], f["key"])
			}
			c, ok := conn[id]
			if !ok {
				return nil, fmt.Errorf("containerd's log has no agent connection of sandbox %s", id)
			}
			var l launch
			for _, v := range []struct {
				to     *float64
				fields map[string]string
				key    string
			}{{&l.ready, f, "ready_ms"}, {&l.dial, c, "dial_ms"}, {&l.handshake, c, "handshake_ms"}, {&l.sync, c, "sync_ms"}} {
				x, err := strconv.ParseFloat(v.fields[v.key], 64)
				if err != nil {
					return nil, fmt.Errorf("sandbox %s: %s %q: %v", id, v.key, v.fields[v.key], err)
				}
				*v.to = x
			}
			out = append(out, l)
		}
		return out, nil
	})
}

// logFields are the key=value fields of a log line's rest.
func logFields(rest string) map[string]string {
	f := map[string]string{}
	for _, kv := range timingField.FindAllStringSubmatch(rest, -1) {
		f[kv[1]] = strings.Trim(kv[2], `"`)
	}
	return f
}

// tmplMem are, per running sandbox, in MiB: the PSS of its shim and
// QEMU (pss), of its QEMU alone (qemu), and of its QEMU's guest RAM
// mapping (ram).
type tmplMem struct{ pss, qemu, ram []float64 }

// tmplMemory runs tmplMemSandboxes containers running `sleep` in template
// mode mode, lets them idle, reads the PSS of each one's shim and QEMU
// (of guestMiB of guest RAM), and removes them.
func (b *ctrdBench) tmplMemory(ctx context.Context, mode string, guestMiB int) (m tmplMem, retErr error) {
	var ids []string
	defer func() {
		for _, id := range ids {
			b.remove(id)
		}
	}()
	for i := 0; i < tmplMemSandboxes; i++ {
		id := b.newID("tmem")
		ids = append(ids, id)
		if err := b.ctr(ctx, io.Discard, "run", "-d", "--runtime", runtimeCocoon,
			"--annotation", oci.AnnotationTemplate+"="+mode, b.image, id, "sleep", "3600"); err != nil {
			return m, err
		}
	}
	select {
	case <-ctx.Done():
		return m, ctx.Err()
	case <-time.After(tmplSettle):
	}
	shims := harness.ShimPIDsOf(harness.ShimBinary, b.c.Address)
	if len(shims) != tmplMemSandboxes {
		return m, fmt.Errorf("%d cocoon shims running, want %d", len(shims), tmplMemSandboxes)
	}
	for _, shim := range shims {
		s, err := rollup(shim)
		if err != nil {
			return m, err
		}
		total, vmm, ram := s.pss, 0.0, 0.0
		for _, pid := range descendants(shim) {
			p, err := rollup(pid)
			if errors.Is(err, os.ErrNotExist) {
				continue // exited meanwhile
			}
			if err != nil {
				return m, err
			}
			total += p.pss
			if strings.HasPrefix(comm(pid), "qemu-system") {
				q, err := qemuMemory(pid, guestMiB)
				if err != nil {
					return m, err
				}
				vmm, ram = vmm+p.pss, ram+q.ramPSS
			}
		}
		if vmm == 0 {
			return m, fmt.Errorf("shim %d has no QEMU", shim)
		}
		m.pss, m.qemu, m.ram = append(m.pss, total), append(m.qemu, vmm), append(m.ram, ram)
	}
	return m, nil
}

// templateResults are the template figures, each next to the cold boot
// measured alternately with it.
func templateResults(f tmplFigures) []Result {
	one := func(name, unit string, v float64, target string) Result {
		return Result{Name: name, Unit: unit, Median: v, Samples: []float64{v}, Target: target}
	}
	of := func(name, unit string, s []float64, target string) Result {
		return Result{Name: name, Unit: unit, Median: median(s), Samples: s, Target: target}
	}
	withRunc := func(r Result) Result {
		m := median(f.ctrStart[2])
		r.Runc, r.RuncSamples = &m, f.ctrStart[2]
		return r
	}
	ratio := func(a, b []float64) float64 {
		if median(b) == 0 {
			return 0
		}
		return median(a) / median(b)
	}
	sum := func(s []float64) float64 {
		var t float64
		for _, v := range s {
			t += v
		}
		return t
	}
	memShare := 0.0
	if sum(f.mem[0].pss) > 0 {
		memShare = 100 * sum(f.mem[1].pss) / sum(f.mem[0].pss)
	}
	n := tmplMemSandboxes
	return []Result{
		one("template creation (boot, settle, save)", "ms", f.create, ""),
		of("sandbox ready from template (launch to agent ready)", "ms", f.ready[1], ""),
		of("  cold boot to agent ready, alternated with it", "ms", f.ready[0], ""),
		one("  cold boot / from template", "x", ratio(f.ready[0], f.ready[1]), ">= 10x (TCG)"),
		of("  whole start call from template (lookup, launch)", "ms", f.call[1], ""),
		of("  whole start call, cold", "ms", f.call[0], ""),
		withRunc(of("ctr run --rm true, sandbox from template", "ms", f.ctrStart[1], "")),
		withRunc(of("ctr run --rm true, sandbox booted (alternated)", "ms", f.ctrStart[0], "")),
		one("  booted / from template", "x", ratio(f.ctrStart[0], f.ctrStart[1]), ">= 1.5x"),
		of("  the shim's launch to ready, from template", "ms", column(f.launches[1], func(l launch) float64 { return l.ready }), ""),
		of("    of which qemu start and state load", "ms", column(f.launches[1], func(l launch) float64 { return l.ready - l.dial - l.handshake - l.sync }), ""),
		of("    of which agent handshake", "ms", column(f.launches[1], func(l launch) float64 { return l.handshake }), ""),
		of("    of which first agent call (guest sync)", "ms", column(f.launches[1], func(l launch) float64 { return l.sync }), ""),
		of("  the shim's launch to ready, booted", "ms", column(f.launches[0], func(l launch) float64 { return l.ready }), ""),
		of("    of which first agent call (guest sync)", "ms", column(f.launches[0], func(l launch) float64 { return l.sync }), ""),
		of("  vm start and stop in shim calls, from template", "ms", column(f.timings[1], func(t startTiming) float64 { return t.vm }), ""),
		of("  vm start and stop in shim calls, booted", "ms", column(f.timings[0], func(t startTiming) float64 { return t.vm }), ""),
		of("  guest agent calls, from template", "ms", column(f.timings[1], func(t startTiming) float64 { return t.guest }), ""),
		of("  guest agent calls, booted", "ms", column(f.timings[0], func(t startTiming) float64 { return t.guest }), ""),
		one(fmt.Sprintf("%d sandboxes from one template: qemu + shim pss, sum", n), "MiB", sum(f.mem[1].pss), ""),
		one(fmt.Sprintf("%d sandboxes booted: qemu + shim pss, sum", n), "MiB", sum(f.mem[0].pss), ""),
		of("  per sandbox, from template", "MiB", f.mem[1].pss, ""),
		of("  per sandbox, booted", "MiB", f.mem[0].pss, ""),
		of("  qemu pss per sandbox, from template", "MiB", f.mem[1].qemu, ""),
		of("  qemu pss per sandbox, booted", "MiB", f.mem[0].qemu, ""),
		of("  of which guest ram, from template", "MiB", f.mem[1].ram, ""),
		of("  of which guest ram, booted", "MiB", f.mem[0].ram, ""),
		one("  from template / booted", "%", memShare, "<= 40 %"),
	}
}

// column is one figure of each of ts.
func column[T any](ts []T, figure func(T) float64) []float64 {
	out := make([]float64, len(ts))
	for i, t := range ts {
		out[i] = figure(t)
	}
	return out
}
