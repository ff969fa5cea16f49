package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// runCritest starts a private containerd v with CRI, its registries
// mirrored to mirror, and runs critest with handler h against it, writing
// ginkgo's JSON report to report and critest's output to logPath. The
// containerd is stopped (and its shims, pods and mounts gone) on return.
func runCritest(ctx context.Context, o options, v, h, mirror, report, logPath string) (retErr error) {
	cgroupsBefore := podCgroupParents()
	c, err := harness.Start(v, harness.WithShimDir(o.shimDir),
		harness.WithCRI(harness.CRIConfig{RegistryMirror: mirror}))
	if err != nil {
		return err
	}
	defer func() {
		// A spec that fails half-way leaves its pod; Stop ends the shims,
		// not the pods' processes.
		if err := removePods(c); err != nil && retErr == nil {
			retErr = err
		}
		if err := c.Stop(); err != nil && retErr == nil {
			retErr = err
		}
		if err := removeCgroupParents(cgroupsBefore); err != nil && retErr == nil {
			retErr = err
		}
	}()
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()

	endpoint := c.CRIEndpoint()
	args := []string{
		"--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
		"--runtime-handler", h,
		"--ginkgo.no-color", "--ginkgo.json-report", report,
		"--ginkgo.timeout", o.timeout.String(),
	}
	if o.focus != "" {
		args = append(args, "--ginkgo.focus", o.focus)
	}
	if o.skip != "" {
		args = append(args, "--ginkgo.skip", o.skip)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, o.critest, args...)
	// critest looks for crictl.yaml next to itself, and writes nothing
	// it needs in its working directory.
	cmd.Dir = filepath.Dir(logPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	fmt.Fprintf(logf, "$ %s %s\n", o.critest, strings.Join(args, " "))
	err = cmd.Run()
	if _, ok := err.(*exec.ExitError); ok {
		// Failed specs: the report says which.
		return nil
	}
	if err != nil {
		return err
	}
	return nil
}

// removePods stops and removes every pod of c, and their containers.
func removePods(c *harness.Containerd) error {
	dir, err := harness.CRIToolsDir()
	if err != nil {
		return err
	}
	ep := c.CRIEndpoint()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(dir, "crictl"), "--runtime-endpoint", ep, "--image-endpoint", ep,
		"--timeout", "60s", "rmp", "--all", "--force").CombinedOutput()
	if err != nil {
		return fmt.Errorf("remove the pods critest left: %w\n%s", err, out)
	}
	return nil
}

// podCgroupParents are the cgroup directories of containerd's default
// cgroup parent of pods, /k8s.io (critest's pods name none under the
// cgroupfs driver), in each hierarchy.
func podCgroupParents() map[string]bool {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/k8s.io")
	if _, err := os.Stat("/sys/fs/cgroup/k8s.io"); err == nil {
		dirs = append(dirs, "/sys/fs/cgroup/k8s.io")
	}
	m := map[string]bool{}
	for _, d := range dirs {
		m[d] = true
	}
	return m
}

// removeCgroupParents removes the pods' cgroup parents that were not there
// before, once empty.
func removeCgroupParents(before map[string]bool) error {
	var errs []error
	for d := range podCgroupParents() {
		if !before[d] {
			if err := syscall.Rmdir(d); err != nil {
				errs = append(errs, fmt.Errorf("remove the cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// critestTemp are the patterns of the directories critest's specs make
// under the temporary directory (log directories, seccomp profiles); a
// spec that fails half-way leaves its own.
var critestTemp = []string{"podLogTest*", "seccomp-tests*"}

// tempDirs lists the directories of critestTemp there are.
func tempDirs() map[string]bool {
	m := map[string]bool{}
	for _, p := range critestTemp {
		dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), p))
		for _, d := range dirs {
			m[d] = true
		}
	}
	return m
}

// removeNewTempDirs removes those that were not there before.
func removeNewTempDirs(before map[string]bool) {
	for d := range tempDirs() {
		if !before[d] {
			_ = os.RemoveAll(d)
		}
	}
}

// shmSegments lists the ids of the host's System V shared memory segments.
func shmSegments() map[string]bool {
	ids := map[string]bool{}
	f, err := os.Open("/proc/sysvipc/shm")
	if err != nil {
		return ids
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan()
	for sc.Scan() {
		if fl := strings.Fields(sc.Text()); len(fl) > 6 && fl[6] == "0" {
			ids[fl[1]] = true
		}
	}
	return ids
}

// removeNewShm removes the unattached segments that were not there
// before: the HostIpc specs make one on the host with ipcmk and leave it.
func removeNewShm(before map[string]bool) {
	for id := range shmSegments() {
		if !before[id] {
			_ = exec.Command("ipcrm", "-m", id).Run()
		}
	}
}

// summarize prints and writes the comparison of the handlers' results on
// containerd v, checks cocoon's against the baseline (or rewrites it) and
// reports whether a spec of the baseline failed.
func summarize(o options, v string, byHandler map[string]results, times map[string]time.Duration) (regressed bool, err error) {
	var b strings.Builder
	fmt.Fprintf(&b, "=== containerd %s, critest v1.37.0\n", v)
	for _, h := range o.handlers {
		fmt.Fprintf(&b, "%-7s %s (%s)\n", h+":", byHandler[h].counts(), times[h].Round(time.Second))
	}
	runc, cocoon := byHandler["runc"], byHandler["cocoon"]
	if runc != nil && cocoon != nil {
		var lost []string
		for _, n := range runc.names(specResult.passed) {
			if s, ok := cocoon[n]; ok && s.failed() {
				lost = append(lost, n)
			}
		}
		fmt.Fprintf(&b, "pass with runc, fail with cocoon (%d):\n", len(lost))
		printFailures(&b, cocoon, lost)
		both := runc.names(func(s specResult) bool { return s.failed() })
		var bothFail []string
		for _, n := range both {
			if cocoon[n].failed() {
				bothFail = append(bothFail, n)
			}
		}
		fmt.Fprintf(&b, "fail with both (%d):\n", len(bothFail))
		printFailures(&b, runc, bothFail)
		var skipped []string
		for _, n := range runc.names(specResult.passed) {
			if s, ok := cocoon[n]; ok && s.State == "skipped" {
				skipped = append(skipped, n)
			}
		}
		if len(skipped) > 0 {
			fmt.Fprintf(&b, "pass with runc, skipped with cocoon (%d):\n", len(skipped))
			printFailures(&b, cocoon, skipped)
		}
		var onlyCocoon []string
		for _, n := range cocoon.names(specResult.passed) {
			if runc[n].failed() {
				onlyCocoon = append(onlyCocoon, n)
			}
		}
		if len(onlyCocoon) > 0 {
			fmt.Fprintf(&b, "pass with cocoon, fail with runc (%d):\n", len(onlyCocoon))
			printFailures(&b, runc, onlyCocoon)
		}
	} else {
		for _, h := range o.handlers {
			failed := byHandler[h].names(specResult.failed)
			fmt.Fprintf(&b, "fail with %s (%d):\n", h, len(failed))
			printFailures(&b, byHandler[h], failed)
		}
	}
	if cocoon != nil {
		r, err := checkBaseline(&b, o, v, cocoon)
		if err != nil {
			return false, err
		}
		regressed = r
	}
	fmt.Print(b.String())
	return regressed, os.WriteFile(filepath.Join(o.outDir, "summary-"+v+".txt"), []byte(b.String()), 0o644)
}

// checkBaseline compares cocoon's results with baseline-<v>.txt, or
// rewrites it with -update-baseline. A spec of the baseline that failed is
// a regression; one that did not run is too, unless -focus or -skip chose
// what runs.
func checkBaseline(b *strings.Builder, o options, v string, cocoon results) (regressed bool, err error) {
	path := filepath.Join(o.baselineDir, "baseline-"+v+".txt")
	passed := cocoon.names(specResult.passed)
	if o.update {
		header := fmt.Sprintf("critest v1.37.0 specs that pass with the cocoon handler on containerd %s\n"+
			"(make critest CRITEST_UPDATE=1 writes this file; make critest fails if one of them fails)", v)
		if err := writeBaseline(path, header, passed); err != nil {
			return false, err
		}
		fmt.Fprintf(b, "baseline %s written: %d specs\n", path, len(passed))
		return false, nil
	}
	want, err := readBaseline(path)
	if os.IsNotExist(err) {
		fmt.Fprintf(b, "no baseline %s (CRITEST_UPDATE=1 writes it)\n", path)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	filtered := o.focus != "" || o.skip != ""
	var lost []string
	for _, n := range want {
		s, ok := cocoon[n]
		switch {
		case ok && s.passed():
		case filtered && (!ok || !s.failed()):
		default:
			lost = append(lost, n)
		}
	}
	var gained []string
	inBaseline := map[string]bool{}
	for _, n := range want {
		inBaseline[n] = true
	}
	for _, n := range passed {
		if !inBaseline[n] {
			gained = append(gained, n)
		}
	}
	fmt.Fprintf(b, "baseline %s: %d specs; %d regressed, %d newly passing\n", path, len(want), len(lost), len(gained))
	if len(lost) > 0 {
		fmt.Fprintf(b, "REGRESSIONS (in the baseline, not passing with cocoon):\n")
		for _, n := range lost {
			s, ok := cocoon[n]
			if !ok {
				fmt.Fprintf(b, "  - %s\n      not in the report\n", n)
				continue
			}
			fmt.Fprintf(b, "  - %s\n      %s: %s\n", n, s.State, brief(s.Message, 4))
		}
	}
	for _, n := range gained {
		fmt.Fprintf(b, "  + %s\n", n)
	}
	return len(lost) > 0, nil
}
