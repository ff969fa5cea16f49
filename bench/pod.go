package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/sandbox"
)

// The pod figures' settings.
const (
	// podParallel is how many pods the parallel start starts at once,
	// and the memory figures hold running.
	podParallel = 10
	// podSettle is how long those pods idle before their memory is read.
	podSettle = 3 * time.Second
	// podCleanWait bounds the wait for a removed pod's shim, VM, mounts
	// and network to be gone.
	podCleanWait = 30 * time.Second
)

// podVersions are the containerd versions the pod figures are taken on:
// 2.4 (the podsandbox controller of the 2.x CRI) and Debian's 1.6.
var podVersions = []string{"2.4", "1.6"}

// podHandlers are the CRI runtime handlers compared: index 0 is Cocoon,
// 1 runc.
var podHandlers = [2]string{harness.CocoonRuntimeHandler, harness.RuncRuntimeHandler}

// podFigures are the pod figures on one containerd version, index 0
// Cocoon, 1 runc.
type podFigures struct {
	// version is containerd's.
	version string
	// serial are the pod starts one at a time.
	serial [2][]podStart
	// wall is the time until all podParallel pods started at once had
	// started, ms (one sample), and parallel those pods' own starts.
	wall     [2][]float64
	parallel [2][]podStart
	// mem is what each of the podParallel running pods cost.
	mem [2][]podMemory
	// booted and cloned count the Cocoon VMs the shims logged as cold
	// boots and as starts from a template; bootReasons are the reasons
	// the boots gave.
	booted, cloned int
	bootReasons    map[string]int
	// ready and readyParallel are the boots to agent ready of the
	// Cocoon pods' VMs, serial and at once, ms, as their shims logged
	// them.
	ready, readyParallel []float64
	// refusal is the shim's answer to a pod that asked for a template
	// (io.cocoon.template=required).
	refusal string
	// accel and channel are what the Cocoon VMs ran with.
	accel, channel string
	// took is how long the version's figures took, containerd's start
	// and stop included.
	took time.Duration
}

// podStart is one pod's start: crictl runp, create and start of one
// container, ms each, and the pod's id.
type podStart struct {
	runp, create, start float64
	pod                 string
}

func (s podStart) total() float64 { return s.runp + s.create + s.start }

// podMemory is what one running pod costs the host, MiB.
type podMemory struct {
	// pss is the PSS of the pod's shim and of every process under it:
	// QEMU and virtiofsd for Cocoon, the pause and the container's
	// process for runc. qemu, virtiofsd and shim are its parts.
	pss, qemu, virtiofsd, shim float64
	// workingSet is the working set of the pod's cgroup as containerd
	// reports it (crictl statsp).
	workingSet float64
}

// podBench drives one private containerd with its CRI through crictl.
type podBench struct {
	c     *harness.Containerd
	x     *harness.Crictl
	image string
	// root holds the Cocoon shims' state and data directories (stateDir,
	// dataDir) and crictl's files; close removes it.
	root, stateDir, dataDir string
	// mu guards live and cgroups.
	mu sync.Mutex
	// live are the pods run and not yet removed, with their cgroup
	// parents.
	live map[string]string
	// cgroups are the cgroup parents of pods that are gone or never
	// ran, which the bench removes as kubelet removes a pod's cgroup.
	cgroups []string
}

// benchPods takes the pod figures on each of podVersions, n serial
// starts per runtime. It leaves no pod, VM, mount, link or cgroup behind.
func benchPods(ctx context.Context, n int) ([]podFigures, error) {
	var out []podFigures
	for _, v := range podVersions {
		f, err := benchPodsOn(ctx, v, n)
		if err != nil {
			return out, fmt.Errorf("containerd %s: %w", v, err)
		}
		out = append(out, f)
	}
	return out, nil
}

func benchPodsOn(ctx context.Context, version string, n int) (f podFigures, retErr error) {
	began := time.Now()
	f.version = version
	b, err := startPodBench(version)
	if err != nil {
		return f, err
	}
	defer func() {
		if err := b.close(); err != nil && retErr == nil {
			retErr = err
		}
		f.took = time.Since(began)
	}()
	// A first pod of each runtime, not timed: it fills the layer cache
	// and the image's snapshots.
	for _, h := range podHandlers {
		if _, err := b.startRemove(ctx, h); err != nil {
			return f, fmt.Errorf("%s: warm-up: %w", h, err)
		}
	}
	// Alternated, so that the host's drift falls on both alike.
	for k := 0; k < n; k++ {
		for i, h := range podHandlers {
			s, err := b.startRemove(ctx, h)
			if err != nil {
				return f, fmt.Errorf("%s: %w", h, err)
			}
			f.serial[i] = append(f.serial[i], s)
		}
	}
	for i, h := range podHandlers {
		if err := b.parallelFigures(ctx, &f, i, h); err != nil {
			return f, fmt.Errorf("%s: %w", h, err)
		}
	}
	if f.refusal, err = b.templateRefusal(ctx); err != nil {
		return f, err
	}
	return f, b.shimLog(&f)
}

// startPodBench starts containerd version with its CRI, Cocoon's shims
// keeping their state and data under a directory of the bench's own and
// cold-booting every VM, and imports the busybox image. The caller must
// close it.
func startPodBench(version string) (*podBench, error) {
	root, err := os.MkdirTemp("", "cocoon-bench-pod-")
	if err != nil {
		return nil, err
	}
	b := &podBench{root: root, stateDir: filepath.Join(root, "run"), dataDir: filepath.Join(root, "lib"), live: map[string]string{}}
	crictlDir := filepath.Join(root, "crictl")
	if err := os.Mkdir(crictlDir, 0o755); err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	b.c, err = harness.Start(version, harness.WithCRI(harness.CRIConfig{}), harness.WithEnv(
		"COCOON_STATE_DIR="+b.stateDir, "COCOON_DATA_DIR="+b.dataDir, "COCOON_TEMPLATE="+config.TemplateNever))
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	if b.x, err = harness.OpenCrictl(b.c, crictlDir); err == nil {
		b.image, err = harness.ImportCRIBusybox(b.c)
	}
	if err != nil {
		return nil, errors.Join(err, b.close())
	}
	return b, nil
}

// close removes the pods left, checks that nothing of them is left,
// stops containerd and its shims, kills any QEMU or virtiofsd of the
// bench's state directory that outlived its shim, and removes root.
func (b *podBench) close() error {
	var errs []error
	if b.x != nil {
		b.mu.Lock()
		left := make([]string, 0, len(b.live))
		for id := range b.live {
			left = append(left, id)
		}
		b.mu.Unlock()
		for _, id := range left {
			errs = append(errs, b.removePod(id))
		}
		errs = append(errs, b.waitClean())
	}
	errs = append(errs, b.c.Stop())
	for _, pid := range pidsWithArg(b.stateDir + "/") {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	errs = append(errs, os.RemoveAll(b.root))
	return errors.Join(errs...)
}

// crictl runs crictl with args, bound to ctx and to two minutes, and
// returns its stdout; the error carries stderr.
func (b *podBench) crictl(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var stdout, stderr strings.Builder
	cmd := b.x.Command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// startPod runs a pod of handler with annotations and one busybox
// container running sleep in it, and times crictl runp, create and
// start. The configurations are written before the clock starts. The
// pod has a cgroup parent of its own under the instance's, as kubelet
// gives each pod one, whose cgroup containerd's pod stats read.
func (b *podBench) startPod(ctx context.Context, handler string, annotations map[string]string) (string, podStart, error) {
	var s podStart
	pod := b.x.PodConfig("bench-" + handler)
	pod.Annotations = annotations
	pod.Linux.CgroupParent = path.Join(b.c.CRICgroupParent(), "pod"+pod.Metadata.UID)
	podFile, err := b.x.WriteConfig("pod", pod)
	if err != nil {
		return "", s, err
	}
	ctrFile, err := b.x.WriteConfig("container", b.x.ContainerConfig("sleep", b.image, "sleep", "3600"))
	if err != nil {
		return "", s, err
	}
	t0 := time.Now()
	id, err := b.crictl(ctx, "runp", "--runtime", handler, podFile)
	t1 := time.Now()
	b.mu.Lock()
	if err != nil {
		b.cgroups = append(b.cgroups, pod.Linux.CgroupParent)
	} else {
		b.live[id] = pod.Linux.CgroupParent
	}
	b.mu.Unlock()
	if err != nil {
		return "", s, err
	}
	ctr, err := b.crictl(ctx, "create", id, ctrFile, podFile)
	if err != nil {
		return id, s, err
	}
	t2 := time.Now()
	if _, err := b.crictl(ctx, "start", ctr); err != nil {
		return id, s, err
	}
	s = podStart{runp: ms(t1.Sub(t0)), create: ms(t2.Sub(t1)), start: ms(time.Since(t2)), pod: id}
	return id, s, nil
}

// removePod stops and removes pod id with its container. It must work
// after the bench's context was cancelled.
func (b *podBench) removePod(id string) error {
	var errs []error
	for _, args := range [][]string{{"stopp", id}, {"rmp", "--force", id}} {
		_, err := b.crictl(context.Background(), args...)
		errs = append(errs, err)
	}
	b.mu.Lock()
	if cg, ok := b.live[id]; ok {
		b.cgroups = append(b.cgroups, cg)
	}
	delete(b.live, id)
	b.mu.Unlock()
	return errors.Join(errs...)
}

// startRemove times one pod's start, then removes it and waits until
// nothing of it is left.
func (b *podBench) startRemove(ctx context.Context, handler string) (podStart, error) {
	id, s, err := b.startPod(ctx, handler, nil)
	if id != "" {
		err = errors.Join(err, b.removePod(id))
	}
	if err != nil {
		return s, err
	}
	return s, b.waitClean()
}

// parallelFigures starts podParallel pods of handler at once, times
// them, lets them idle, reads what each costs, and removes them.
func (b *podBench) parallelFigures(ctx context.Context, f *podFigures, i int, handler string) error {
	ids := make([]string, podParallel)
	starts := make([]podStart, podParallel)
	errs := make([]error, podParallel)
	var wg sync.WaitGroup
	t0 := time.Now()
	for k := range podParallel {
		wg.Go(func() { ids[k], starts[k], errs[k] = b.startPod(ctx, handler, nil) })
	}
	wg.Wait()
	wall := ms(time.Since(t0))
	err := errors.Join(errs...)
	if err == nil {
		f.wall[i], f.parallel[i] = []float64{wall}, starts
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(podSettle):
			f.mem[i], err = b.memory(ctx, handler, ids)
		}
	}
	for k, id := range ids {
		if id != "" {
			wg.Go(func() { errs[k] = b.removePod(id) })
		}
	}
	wg.Wait()
	if err = errors.Join(append(errs, err)...); err != nil {
		return err
	}
	return b.waitClean()
}

// waitClean removes the cgroups of the pods that are gone and waits
// (podCleanWait at most) until no pod is listed and nothing of the
// removed ones is left: CRI's leftovers (shims, links on the bridge,
// mounts, network namespaces, processes in containers, cgroups, iptables
// rules, addresses), a QEMU or virtiofsd of the bench's state directory,
// a sandbox's state or a container's scratch disk.
func (b *podBench) waitClean() error {
	var left string
	for deadline := time.Now().Add(podCleanWait); ; time.Sleep(200 * time.Millisecond) {
		if left = b.leftovers(); left == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("left on the host %v after the pods were removed:\n%s", podCleanWait, left)
		}
	}
}

func (b *podBench) leftovers() string {
	found := b.removeCgroups()
	if pods, err := b.crictl(context.Background(), "pods", "-q"); err != nil {
		found = append(found, err.Error())
	} else if pods != "" {
		found = append(found, "pods still listed: "+strings.Join(strings.Fields(pods), " "))
	}
	if l := b.c.CRILeftovers(); l != "" {
		found = append(found, l)
	}
	for _, pid := range pidsWithArg(b.stateDir + "/") {
		found = append(found, fmt.Sprintf("process %d (%s) of the bench's sandboxes", pid, comm(pid)))
	}
	for _, dir := range []string{
		filepath.Join(b.stateDir, harness.CRINamespace),
		filepath.Join(b.dataDir, sandbox.ContainersDirName, harness.CRINamespace),
	} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			found = append(found, "left in "+dir+": "+e.Name())
		}
	}
	return strings.Join(found, "\n")
}

// removeCgroups removes the cgroup parents of the pods that are gone, in
// each cgroup hierarchy, with what their pods' runtimes left in them,
// and lists those that remain (a shim leaving its pod's cgroup, say).
func (b *podBench) removeCgroups() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var found, keep []string
	for _, cg := range b.cgroups {
		dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", cg))
		if _, err := os.Stat(filepath.Join(cgroupRoot, cg, "cgroup.procs")); err == nil {
			dirs = append(dirs, filepath.Join(cgroupRoot, cg))
		}
		left := false
		for _, d := range dirs {
			kids, _ := filepath.Glob(filepath.Join(d, "*", "cgroup.procs"))
			for _, k := range kids {
				_ = syscall.Rmdir(filepath.Dir(k))
			}
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				found = append(found, fmt.Sprintf("cgroup %s: %v", d, err))
				left = true
			}
		}
		if left {
			keep = append(keep, cg)
		}
	}
	b.cgroups = keep
	return found
}

// cgroupRoot is where the cgroup hierarchies are mounted: cgroup v2's,
// or a directory per cgroup v1 hierarchy.
const cgroupRoot = "/sys/fs/cgroup"

// templateRefusal runs a Cocoon pod that asks for a template
// (io.cocoon.template=required), which the shim must refuse, and
// returns the reason it gave.
func (b *podBench) templateRefusal(ctx context.Context) (string, error) {
	id, _, err := b.startPod(ctx, harness.CocoonRuntimeHandler, map[string]string{oci.AnnotationTemplate: config.TemplateRequired})
	if id != "" {
		return "", errors.Join(errors.New("a pod that asked for a template started"), b.removePod(id))
	}
	if err == nil || ctx.Err() != nil {
		return "", errors.Join(errors.New("a pod that asked for a template: no answer"), err)
	}
	m := refusalReason.FindStringSubmatch(err.Error())
	if m == nil {
		return "", fmt.Errorf("a pod that asked for a template failed otherwise: %w", err)
	}
	// The pod's own paths say nothing of the reason.
	return hostPath.ReplaceAllString(m[1], "<path>"), b.waitClean()
}

// hostPath matches an absolute path in a message.
var hostPath = regexp.MustCompile(`/[^\s,:]+`)

// refusalReason finds why the shim refused a pod's template in crictl's
// error, which holds containerd's and the shim's wrapping around it.
var refusalReason = regexp.MustCompile(`template\.mode is required: (.*?)(?:: not implemented|$)`)

// shim log lines about how the Cocoon VMs started.
var (
	bootedLine = regexp.MustCompile(`msg="sandbox booted"(.*)`)
	clonedLine = regexp.MustCompile(`msg="sandbox started from template"`)
	reasonKV   = regexp.MustCompile(`reason=("(?:[^"\\]|\\.)*"|\S+)`)
)

// shimLog reads from containerd's log, where the shims' lines go, how
// the Cocoon VMs started and what they ran with, and the boot to agent
// ready of each Cocoon pod's VM (a pod's id is its sandbox's).
func (b *podBench) shimLog(f *podFigures) error {
	log := b.c.Log()
	f.bootReasons = map[string]int{}
	ready := map[string]float64{}
	for _, m := range bootedLine.FindAllStringSubmatch(log, -1) {
		f.booted++
		why := "?"
		if r := reasonKV.FindStringSubmatch(m[1]); r != nil {
			why = r[1]
			if u, err := strconv.Unquote(why); err == nil {
				why = u
			}
		}
		f.bootReasons[why]++
		kv := logFields(m[1])
		ready[kv["sandbox"]], _ = strconv.ParseFloat(kv["ready_ms"], 64)
	}
	f.cloned = len(clonedLine.FindAllStringIndex(log, -1))
	if m := startingLine.FindStringSubmatch(log); m != nil {
		fields := logFields(m[1])
		f.accel, f.channel = fields["accel"], fields["channel"]
	}
	pick := func(starts []podStart) ([]float64, error) {
		var out []float64
		for _, s := range starts {
			r, ok := ready[s.pod]
			if !ok {
				return nil, fmt.Errorf("containerd's log has no boot of pod %s", s.pod)
			}
			out = append(out, r)
		}
		return out, nil
	}
	var err error
	if f.ready, err = pick(f.serial[0]); err != nil {
		return err
	}
	f.readyParallel, err = pick(f.parallel[0])
	return err
}
