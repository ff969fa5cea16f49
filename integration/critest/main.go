// Command critest runs the CRI validation suite of cri-tools (critest
// v1.37) against private containerd instances with CRI, offline, once
// with the runc handler and once with cocoon's, and compares the two.
//
// critest pulls its images from registry.k8s.io and gcr.io. Here they are
// stand-ins built from Debian's busybox-static and this directory's
// standin program (images.go says which and why), pushed to an in-memory
// registry on 127.0.0.1 (go-containerregistry's pkg/registry) that the
// containerd's registry configuration mirrors those registries to.
//
// Each (containerd version, handler) run gets a fresh containerd and
// writes ginkgo's JSON report; the per-spec results come from it. The
// specs that pass with cocoon are compared with baseline-<version>.txt:
// with -check, one of them failing is a regression and the command
// exits 1; -update-baseline rewrites the files from this run.
//
// `make critest` runs it (docs/conformance.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// options are the command's flags.
type options struct {
	versions, handlers []string
	critest            string
	busybox, standin   string
	shimDir            string
	outDir             string
	baselineDir        string
	focus, skip        string
	check, update      bool
	serve, reread      bool
	vmLock             string
	timeout            time.Duration
}

func main() {
	var o options
	var versions, handlers string
	flag.StringVar(&versions, "containerd", "2.4,1.6", "containerd versions to run against, comma-separated")
	flag.StringVar(&handlers, "handlers", "runc,cocoon", "CRI runtime handlers to run critest with, comma-separated")
	flag.StringVar(&o.critest, "critest", "/opt/cocoon-test/cri-tools-1.37/bin/critest", "the critest binary")
	flag.StringVar(&o.busybox, "busybox", "/bin/busybox", "the static busybox the images are made of")
	flag.StringVar(&o.standin, "standin", "", "the static standin binary (go build ./standin)")
	flag.StringVar(&o.shimDir, "bin", os.Getenv("COCOON_BIN"), "directory holding containerd-shim-cocoon-v2 (default $COCOON_BIN)")
	flag.StringVar(&o.outDir, "out", "build/critest", "directory for the reports and logs")
	flag.StringVar(&o.baselineDir, "baseline-dir", ".", "directory of the baseline-<version>.txt files")
	flag.StringVar(&o.focus, "focus", "", "critest --ginkgo.focus")
	flag.StringVar(&o.skip, "skip", "", "critest --ginkgo.skip")
	flag.BoolVar(&o.check, "check", false, "exit 1 if a spec of the baseline does not pass with cocoon")
	flag.BoolVar(&o.update, "update-baseline", false, "write the baselines from this run's cocoon results")
	flag.BoolVar(&o.serve, "serve", false, "only serve the stand-in images on the registry, until interrupted")
	flag.BoolVar(&o.reread, "reread", false, "run nothing: summarize (and check) the reports a run left in -out")
	flag.StringVar(&o.vmLock, "vm-lock", "/tmp/cocoon-vm-tests.lock", "lock held (flock) while critest runs with a handler that starts VMs")
	flag.DurationVar(&o.timeout, "timeout", 45*time.Minute, "time limit of one critest run")
	flag.Parse()
	o.versions, o.handlers = splitList(versions), splitList(handlers)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if errors.Is(err, errRegression) {
		os.Exit(1)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "critest:", err)
		os.Exit(2)
	}
}

// errRegression is returned when a spec of a baseline failed.
var errRegression = errors.New("regression")

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// hostPorts are the host ports critest's specs listen on or map to
// (pkg/validate/consts.go, consts_linux.go): they must be free.
var hostPorts = []int{12000, 12001, 12002, 12003}

func run(ctx context.Context, o options) error {
	// Absolute: critest runs in it.
	out, err := filepath.Abs(o.outDir)
	if err != nil {
		return err
	}
	o.outDir = out
	if o.reread {
		return summarizeAll(ctx, o, func(v, h string) (results, time.Duration, error) {
			res, _, took, err := readReport(reportPath(o, v, h) + ".json")
			return res, took, err
		})
	}
	if o.standin == "" {
		return fmt.Errorf("-standin is required")
	}
	if !o.serve {
		if err := checkHost(o); err != nil {
			return err
		}
	}

	t0 := time.Now()
	images, err := buildImages(o.busybox, o.standin)
	if err != nil {
		return fmt.Errorf("build the images: %w", err)
	}
	reg, err := startRegistry()
	if err != nil {
		return err
	}
	defer reg.stop()
	if err := reg.push(ctx, images); err != nil {
		return err
	}
	fmt.Printf("--- %d stand-in images on the registry at %s (%.1fs)\n", len(images), reg.addr, time.Since(t0).Seconds())
	if o.serve {
		<-ctx.Done()
		return nil
	}

	return summarizeAll(ctx, o, func(v, h string) (results, time.Duration, error) {
		return runOne(ctx, o, v, h, reg.addr)
	})
}

// checkHost checks what a run needs of the host: root, critest, the
// shim, the host ports the specs use; and makes the output directory.
func checkHost(o options) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root: containerd needs it")
	}
	if _, err := os.Stat(o.critest); err != nil {
		return fmt.Errorf("critest: %w (make test-deps builds it)", err)
	}
	if o.shimDir == "" {
		return fmt.Errorf("-bin (or COCOON_BIN) is required: the directory of containerd-shim-cocoon-v2")
	}
	for _, p := range hostPorts {
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			return fmt.Errorf("host port %d, which critest's specs use, is taken: %w", p, err)
		}
		l.Close()
	}
	return os.MkdirAll(o.outDir, 0o755)
}

// summarizeAll gets each version's results of each handler from get (a
// run, or a report read again), summarizes each version's and returns
// errRegression if one regressed and -check is set.
func summarizeAll(ctx context.Context, o options, get func(v, h string) (results, time.Duration, error)) error {
	var regressed bool
	for _, v := range o.versions {
		byHandler := map[string]results{}
		times := map[string]time.Duration{}
		for _, h := range o.handlers {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			res, took, err := get(v, h)
			if err != nil {
				return fmt.Errorf("containerd %s, %s: %w", v, h, err)
			}
			byHandler[h], times[h] = res, took
		}
		r, err := summarize(o, v, byHandler, times)
		if err != nil {
			return err
		}
		regressed = regressed || r
	}
	if regressed && o.check {
		return errRegression
	}
	return nil
}

// reportPath is where the run of handler h on containerd v writes its
// report (.json) and log (.log), without the extension.
func reportPath(o options, v, h string) string {
	return filepath.Join(o.outDir, fmt.Sprintf("containerd-%s-%s", v, h))
}

// runOne runs critest with handler h against a fresh containerd v, holding
// the VM test lock if h starts VMs, and reads its report.
func runOne(ctx context.Context, o options, v, h, mirror string) (results, time.Duration, error) {
	if h != "runc" {
		unlock, err := lockVMTests(ctx, o.vmLock)
		if err != nil {
			return nil, 0, err
		}
		defer unlock()
	}
	base := reportPath(o, v, h)
	report, logPath := base+".json", base+".log"
	_ = os.Remove(report)
	shm, tmp := shmSegments(), tempDirs()
	t0 := time.Now()
	fmt.Printf("--- containerd %s, handler %s: critest (log: %s)\n", v, h, logPath)
	runErr := runCritest(ctx, o, v, h, mirror, report, logPath)
	took := time.Since(t0)
	removeNewShm(shm)
	removeNewTempDirs(tmp)
	res, suiteFailure, _, err := readReport(report)
	if err != nil {
		if runErr != nil {
			return nil, 0, fmt.Errorf("%v (and no report: %v)", runErr, err)
		}
		return nil, 0, err
	}
	if suiteFailure != "" {
		fmt.Printf("    suite failure:\n%s", suiteFailure)
	}
	fmt.Printf("    %s in %s\n", res.counts(), took.Round(time.Second))
	return res, took, nil
}

// lockVMTests takes the lock that keeps VM tests of several people from
// running at once (flock(1) on the same file waits for it, and the other
// way round). Waiting for it ends with ctx.
func lockVMTests(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		return func() { f.Close() }, nil
	}
	fmt.Printf("--- waiting for %s (another VM test holds it)\n", path)
	t0 := time.Now()
	locked := make(chan error, 1)
	go func() { locked <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-locked:
		if err != nil {
			f.Close()
			return nil, err
		}
	case <-ctx.Done():
		// The blocked flock ends with the process.
		return nil, ctx.Err()
	}
	fmt.Printf("    got it after %s\n", time.Since(t0).Round(time.Second))
	return func() { f.Close() }, nil
}
