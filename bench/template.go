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
	"github.com/cocoonrt/cocoon/runtime/template"
)

// tmplMemSandboxes is how many running sandboxes of each kind the
// template memory figure holds at once.
const tmplMemSandboxes = 10

// tmplSettle is how long the running sandboxes idle before their memory
// is read.
const tmplSettle = 3 * time.Second

// The kinds of start the template figures compare.
const (
	// kBooted boots.
	kBooted = iota
	// kClone starts from the template in a QEMU launched for it.
	kClone
	// kSpare starts from the template by taking its spare over.
	kSpare
	// kRunc is runc, in the containerd figures only.
	kRunc
	nVMKinds = kSpare + 1
)

// tmplFigures are the template figures, indexed by kind.
type tmplFigures struct {
	// ready is the sandbox's ReadyIn (launch, or a spare's claim, to
	// agent ready) and call the whole start call (lookup and
	// verification of the template, image verification, state
	// directory, launch or claim, ready), in ms, through the runtime
	// API; the kinds alternate.
	ready, call [nVMKinds][]float64
	// create is CreateTemplate's wall time, ms.
	create float64
	// ctrStart is `ctr run --rm <image> true` in ms, the kinds
	// alternating.
	ctrStart [kRunc + 1][]float64
	// launches are the shim's accounts of those starts (its
	// "sandbox booted" and "sandbox started from template" lines).
	launches [nVMKinds][]launch
	// timings are the shim's accounts of those starts.
	timings [nVMKinds][]startTiming
	// mem are the running sandboxes' memory figures: booted, clones.
	mem            [2]tmplMem
	accel, channel string
}

// tmplKinds are the containerd figures' kinds: the id prefix, the
// runtime and the annotations that choose the kind.
var tmplKinds = [kRunc + 1]struct {
	prefix, rt  string
	annotations []string
}{
	kBooted: {"tcold", runtimeCocoon, []string{oci.AnnotationTemplate + "=" + config.TemplateNever}},
	kClone:  {"tclone", runtimeCocoon, []string{oci.AnnotationTemplate + "=" + config.TemplateRequired, oci.AnnotationTemplateSpare + "=false"}},
	kSpare:  {"tspare", runtimeCocoon, []string{oci.AnnotationTemplate + "=" + config.TemplateRequired, oci.AnnotationTemplateSpare + "=true"}},
	kRunc:   {"trunc", runtimeRunc, nil},
}

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
	shape, err := e.CurrentShape()
	if err != nil {
		return f, err
	}
	key := shape.Key()
	if err := f.startFigures(ctx, &e, key, n); err != nil {
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
	defer stopSpare(e.Config.Runtime.StateDir, key)
	if err := b.tmplStartFigures(ctx, &f, e.Config.Runtime.StateDir, key, ctrN); err != nil {
		// The spares' own account.
		spares, _ := os.ReadFile(filepath.Join(e.Templates().Dir(), template.LogName))
		return f, fmt.Errorf("%w\nthe spares' log:\n%s", err, spares)
	}
	if err := stopSpare(e.Config.Runtime.StateDir, key); err != nil {
		return f, err
	}
	for k, kind := range []int{kBooted, kClone} {
		if f.mem[k], err = b.tmplMemory(ctx, tmplKinds[kind].annotations, e.Config.Hypervisor.MemoryMiB); err != nil {
			return f, err
		}
	}
	return f, nil
}

// stopSpare stops the spare of key under stateDir, if one waits or is
// being made.
func stopSpare(stateDir, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return sandbox.EndSpare(ctx, stateDir, key)
}

// awaitSpare waits until no spare of key is being made: one waits for a
// claim, or none is there.
func awaitSpare(ctx context.Context, stateDir, key string) error {
	for !sandbox.SpareWaits(stateDir, key) && sandbox.SpareHeld(stateDir, key) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the spare of %s: %w", key, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// startFigures starts n sandboxes of each kind through the runtime API,
// alternating, the kind that goes first rotating each round so that a
// drift of the host's speed weighs on all alike. The spare of a spare's
// start is made in this process, and waits before the start is timed.
func (f *tmplFigures) startFigures(ctx context.Context, e *admin.Env, key string, n int) error {
	for i := 0; i < n; i++ {
		for j := range nVMKinds {
			k := (i + j) % nVMKinds
			ready, call, err := f.startOnce(ctx, e, key, k)
			if err != nil {
				return err
			}
			f.ready[k] = append(f.ready[k], ready)
			f.call[k] = append(f.call[k], call)
		}
	}
	return nil
}

// startOnce starts one sandbox of kind k, runs `true` in it (a clone must
// work, not only answer) and stops it.
func (f *tmplFigures) startOnce(ctx context.Context, e *admin.Env, key string, k int) (ready, call float64, retErr error) {
	var claimed chan error
	if k == kSpare {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		claimed = make(chan error, 1)
		go func() { claimed <- e.RunSpare(sctx, io.Discard, admin.TemplateOptions{Key: key}) }()
		for !sandbox.SpareWaits(e.Config.Runtime.StateDir, key) {
			select {
			case err := <-claimed:
				return 0, 0, fmt.Errorf("make a spare: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	began := time.Now()
	var sb *sandbox.Sandbox
	var err error
	if k == kBooted {
		sb, err = e.StartSandbox(ctx, "bench-cold")
	} else {
		env := *e
		env.Config.Template.Spare = k == kSpare
		var use sandbox.TemplateUse
		sb, use, err = env.StartSandboxWithTemplate(ctx, "bench-clone")
		if err == nil && (!use.Used || use.Spare != (k == kSpare)) {
			err = fmt.Errorf("the sandbox did not start as asked (spare %v): from the template %v, its spare %v (%s)", k == kSpare, use.Used, use.Spare, use.Why)
			_ = sb.Stop(context.WithoutCancel(ctx))
		}
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
	if claimed != nil {
		if err := <-claimed; err != nil {
			return 0, 0, fmt.Errorf("the spare: %w", err)
		}
	}
	p, err := sb.Agent().Start(ctx, agent.ProcessSpec{ID: "true", Args: []string{"/bin/true"}, Stdout: io.Discard})
	if err == nil {
		_, err = p.Wait(ctx)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("run true (kind %d): %w", k, err)
	}
	return ms(sb.ReadyIn), call, nil
}

// tmplStartFigures times ctrN runs of `ctr run --rm <image> true` of
// each kind in turn (the order rotating each round), after one run of
// each that is not counted: the first of a kind fills the layer cache of
// this data directory or verifies the template's files. A start from a
// template with spares on leaves a spare behind, made in the background;
// each timed run waits for it to be made, so that no run shares the host
// with it, and a start from a spare finds one waiting.
func (b *ctrdBench) tmplStartFigures(ctx context.Context, f *tmplFigures, stateDir, key string, ctrN int) error {
	run := func(k int, prefix string) (float64, error) {
		args := []string{"run", "--rm", "--runtime", tmplKinds[k].rt}
		for _, a := range tmplKinds[k].annotations {
			args = append(args, "--annotation", a)
		}
		id := b.newID(prefix)
		if err := awaitSpare(ctx, stateDir, key); err != nil {
			return 0, err
		}
		if k == kSpare && !sandbox.SpareWaits(stateDir, key) {
			// None yet: a start of the kind, not counted, leaves one.
			if _, err := b.ctrRun(ctx, args, b.newID("tprime")); err != nil {
				return 0, err
			}
			if err := awaitSpare(ctx, stateDir, key); err != nil {
				return 0, err
			}
		}
		d, err := b.ctrRun(ctx, args, id)
		if err != nil {
			return 0, err
		}
		return d, nil
	}
	for k := range tmplKinds {
		if _, err := run(k, "warm"); err != nil {
			return err
		}
	}
	for i := 0; i < ctrN; i++ {
		for j := range tmplKinds {
			k := (i + j) % len(tmplKinds)
			d, err := run(k, tmplKinds[k].prefix)
			if err != nil {
				return err
			}
			f.ctrStart[k] = append(f.ctrStart[k], d)
		}
	}
	for k := range nVMKinds {
		var err error
		if f.launches[k], err = b.launches(tmplKinds[k].prefix+"-", k, ctrN); err != nil {
			return err
		}
		if f.timings[k], err = b.timings(tmplKinds[k].prefix+"-", ctrN); err != nil {
			return err
		}
	}
	return nil
}

// ctrRun runs `ctr <args> <image> <id> true` (args a `run --rm` and its
// options) and returns its time in ms.
func (b *ctrdBench) ctrRun(ctx context.Context, args []string, id string) (float64, error) {
	start := time.Now()
	if err := b.ctr(ctx, io.Discard, append(args, b.image, id, "true")...); err != nil {
		return 0, err
	}
	delete(b.live, id) // --rm removed it
	return ms(time.Since(start)), nil
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
// started as kind k says.
func (b *ctrdBench) launches(prefix string, k, want int) ([]launch, error) {
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
			if fromTemplate := m[1] != "booted"; fromTemplate != (k != kBooted) || fromTemplate && (f["spare"] == "true") != (k == kSpare) {
				var why []string
				for _, l := range lines {
					if strings.Contains(l, "sandbox="+id) && strings.Contains(l, "spare") {
						why = append(why, l)
					}
				}
				return nil, fmt.Errorf("sandbox %s: the shim says %q (key %s, spare %s)\n%s", id, "sandbox "+m[1], f["key"], f["spare"], strings.Join(why, "\n"))
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

// tmplMemory runs tmplMemSandboxes containers running `sleep` with
// annotations, lets them idle, reads the PSS of each one's shim and QEMU
// (of guestMiB of guest RAM), and removes them.
func (b *ctrdBench) tmplMemory(ctx context.Context, annotations []string, guestMiB int) (m tmplMem, retErr error) {
	var ids []string
	defer func() {
		for _, id := range ids {
			b.remove(id)
		}
	}()
	for i := 0; i < tmplMemSandboxes; i++ {
		id := b.newID("tmem")
		ids = append(ids, id)
		args := []string{"run", "-d", "--runtime", runtimeCocoon}
		for _, a := range annotations {
			args = append(args, "--annotation", a)
		}
		if err := b.ctr(ctx, io.Discard, append(args, b.image, id, "sleep", "3600")...); err != nil {
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
		m := median(f.ctrStart[kRunc])
		r.Runc, r.RuncSamples = &m, f.ctrStart[kRunc]
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
	ready := func(k int) []float64 { return column(f.launches[k], func(l launch) float64 { return l.ready }) }
	return []Result{
		one("template creation (boot, settle, save)", "ms", f.create, ""),
		of("sandbox ready from template, taking its spare over", "ms", f.ready[kSpare], ""),
		of("  cold boot to agent ready, alternated with it", "ms", f.ready[kBooted], ""),
		one("  cold boot / from template's spare", "x", ratio(f.ready[kBooted], f.ready[kSpare]), ">= 10x (TCG)"),
		of("  whole start call from the spare (lookup, claim)", "ms", f.call[kSpare], ""),
		of("  whole start call, cold", "ms", f.call[kBooted], ""),
		of("sandbox ready from template, no spare (qemu launched)", "ms", f.ready[kClone], ""),
		one("  cold boot / from template without a spare", "x", ratio(f.ready[kBooted], f.ready[kClone]), ""),
		of("  whole start call from template without a spare", "ms", f.call[kClone], ""),
		withRunc(of("ctr run --rm true, sandbox from template's spare", "ms", f.ctrStart[kSpare], "")),
		withRunc(of("ctr run --rm true, sandbox from template, no spare", "ms", f.ctrStart[kClone], "")),
		withRunc(of("ctr run --rm true, sandbox booted (alternated)", "ms", f.ctrStart[kBooted], "")),
		one("  booted / from template's spare", "x", ratio(f.ctrStart[kBooted], f.ctrStart[kSpare]), ">= 1.5x"),
		one("  booted / from template without a spare", "x", ratio(f.ctrStart[kBooted], f.ctrStart[kClone]), ""),
		of("  the shim's launch to ready, from the spare", "ms", ready(kSpare), ""),
		of("    of which agent handshake", "ms", column(f.launches[kSpare], func(l launch) float64 { return l.handshake }), ""),
		of("    of which first agent call (guest sync)", "ms", column(f.launches[kSpare], func(l launch) float64 { return l.sync }), ""),
		of("  the shim's launch to ready, no spare", "ms", ready(kClone), ""),
		of("    of which qemu start and state load", "ms", column(f.launches[kClone], func(l launch) float64 { return l.ready - l.dial - l.handshake - l.sync }), ""),
		of("    of which agent handshake", "ms", column(f.launches[kClone], func(l launch) float64 { return l.handshake }), ""),
		of("    of which first agent call (guest sync)", "ms", column(f.launches[kClone], func(l launch) float64 { return l.sync }), ""),
		of("  the shim's launch to ready, booted", "ms", ready(kBooted), ""),
		of("    of which first agent call (guest sync)", "ms", column(f.launches[kBooted], func(l launch) float64 { return l.sync }), ""),
		of("  vm start and stop in shim calls, from the spare", "ms", column(f.timings[kSpare], func(t startTiming) float64 { return t.vm }), ""),
		of("  vm start and stop in shim calls, no spare", "ms", column(f.timings[kClone], func(t startTiming) float64 { return t.vm }), ""),
		of("  vm start and stop in shim calls, booted", "ms", column(f.timings[kBooted], func(t startTiming) float64 { return t.vm }), ""),
		of("  guest agent calls, from the spare", "ms", column(f.timings[kSpare], func(t startTiming) float64 { return t.guest }), ""),
		of("  guest agent calls, no spare", "ms", column(f.timings[kClone], func(t startTiming) float64 { return t.guest }), ""),
		of("  guest agent calls, booted", "ms", column(f.timings[kBooted], func(t startTiming) float64 { return t.guest }), ""),
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
