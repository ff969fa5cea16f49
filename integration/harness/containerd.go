// Package harness starts private containerd instances (1.6 from Debian,
// 2.4 built from source) and drives them with their own ctr, for the
// integration tests. Each instance has its root, state, sockets and log
// under the test's temporary directory, CRI disabled (WithCRI enables it,
// see cri.go), and Cocoon's shim on its PATH; nothing of the host's
// containerd is touched.
package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The containerd builds the harness knows. COCOON_CONTAINERD_16,
// COCOON_CONTAINERD_17 and COCOON_CONTAINERD_24 override the bin
// directories. A version that is not installed is skipped. 1.7 is not
// packaged: build it with `go build -mod=mod -o <dir>/ ./cmd/containerd
// ./cmd/ctr` in a writable copy of github.com/containerd/containerd@v1.7.30
// from the module cache.
var builds = map[string]struct {
	// dir holds containerd and ctr.
	dir    string
	envVar string
	// configVersion is the config schema the build reads.
	configVersion int
	// disabled are the plugins turned off for speed: CRI and its parts.
	disabled []string
}{
	"1.6": {"/usr/bin", "COCOON_CONTAINERD_16", 2, []string{"io.containerd.grpc.v1.cri"}},
	"1.7": {"/opt/cocoon-test/containerd-1.7/bin", "COCOON_CONTAINERD_17", 2, []string{"io.containerd.grpc.v1.cri", "io.containerd.nri.v1.nri"}},
	"2.4": {"/opt/cocoon-test/containerd-2.4/bin", "COCOON_CONTAINERD_24", 3, []string{
		"io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images",
		"io.containerd.podsandbox.controller.v1.podsandbox", "io.containerd.sandbox.controller.v1.shim",
		"io.containerd.nri.v1.nri",
	}},
}

// Containerd is a running private containerd.
type Containerd struct {
	// Version is "1.6", "1.7" or "2.4".
	Version string
	// Dir holds everything of this instance: config, root, state, log.
	Dir string
	// Address is the gRPC socket; Namespace the namespace Ctr uses.
	Address   string
	Namespace string
	// Bin holds the containerd and ctr binaries; ShimDir the shim.
	Bin     string
	ShimDir string
	// Env is added to containerd's environment (and so the shims').
	Env []string

	// cri is the CRI set-up of WithCRI; nil: CRI is disabled.
	cri *criSetup

	// t is the test that started the instance, nil outside tests.
	t testing.TB
	// logf reports shims killed at Stop; nil: not reported.
	logf func(format string, args ...any)
	cmd  *exec.Cmd
	// stopOnce makes Stop idempotent.
	stopOnce sync.Once
	// exited is closed when containerd has exited.
	exited chan struct{}
}

// Option changes how StartContainerd starts containerd.
type Option func(*Containerd)

// WithEnv adds KEY=VALUE settings to containerd's environment, which its
// shims inherit (COCOON_* configuration, for example).
func WithEnv(kv ...string) Option {
	return func(c *Containerd) { c.Env = append(c.Env, kv...) }
}

// WithShimDir puts dir (holding containerd-shim-cocoon-v2) first on
// containerd's PATH instead of the default (see ShimDir).
func WithShimDir(dir string) Option {
	return func(c *Containerd) { c.ShimDir = dir }
}

// ErrNotInstalled is returned by Start for a containerd build that is not
// on this machine; the tests skip on it.
var ErrNotInstalled = errors.New("containerd build not installed")

// StartContainerd starts a private containerd of the given version ("1.6",
// "1.7" or "2.4") and stops it when the test ends, failing the test if it
// cannot. Its log is printed if the test failed.
func StartContainerd(t testing.TB, version string, opts ...Option) *Containerd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("containerd needs root")
	}
	if _, ok := builds[version]; !ok {
		t.Fatalf("containerd %q: want 1.6, 1.7 or 2.4", version)
	}
	opts = append(opts, func(c *Containerd) { c.t, c.logf = t, t.Logf })
	c, err := Start(version, opts...)
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd %s log:\n%s", c.Version, c.Log())
		}
		if err := c.Stop(); err != nil {
			t.Logf("%v", err)
		}
	})
	return c
}

// Start starts a private containerd of the given version ("1.6", "1.7" or
// "2.4") and waits until it answers; the caller must call Stop. It is
// StartContainerd for programs that are not tests (the bench, the demo).
// Without WithShimDir, the shim is found as ShimDir finds it.
func Start(version string, opts ...Option) (*Containerd, error) {
	b, ok := builds[version]
	if !ok {
		return nil, fmt.Errorf("containerd %q: want 1.6, 1.7 or 2.4", version)
	}
	bin := b.dir
	if d := os.Getenv(b.envVar); d != "" {
		bin = d
	}
	if _, err := os.Stat(filepath.Join(bin, "containerd")); err != nil {
		return nil, fmt.Errorf("%w: containerd %s is not installed in %s (set %s): %v", ErrNotInstalled, version, bin, b.envVar, err)
	}
	// Short: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "ctrd"+strings.ReplaceAll(version, ".", ""))
	if err != nil {
		return nil, err
	}
	c := &Containerd{
		Version:   version,
		Dir:       dir,
		Address:   filepath.Join(dir, "c.sock"),
		Namespace: "cocoon-test",
		Bin:       bin,
	}
	for _, o := range opts {
		o(c)
	}
	if c.ShimDir == "" {
		if c.ShimDir, err = FindShimDir(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("build the shim: %w", err)
		}
	}
	config := c.config(b.configVersion, b.disabled)
	if c.cri != nil {
		config, err = c.prepareCRI(b.configVersion, b.disabled)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644)
	}
	if err == nil {
		err = c.launch()
	}
	if err != nil {
		if c.cri != nil {
			_ = c.stopCRI()
		}
		os.RemoveAll(dir)
		return nil, err
	}
	err = c.waitReady(30 * time.Second)
	if err == nil && c.cri != nil {
		err = c.importPause()
	}
	if err != nil {
		log := c.Log()
		_ = c.Stop()
		return nil, fmt.Errorf("containerd %s: %v\n%s", version, err, log)
	}
	return c, nil
}

// launch starts the containerd process of c, appending to its log.
func (c *Containerd) launch() error {
	logf, err := os.OpenFile(filepath.Join(c.Dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(c.Bin, "containerd"), "--config", filepath.Join(c.Dir, "config.toml"))
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Env = append(cmd.Env, "PATH="+c.ShimDir+":"+c.Bin+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a test's end never leaves it behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start containerd %s: %v", c.Version, err)
	}
	exited := make(chan struct{})
	c.cmd, c.exited = cmd, exited
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	return nil
}

// Restart stops containerd (SIGTERM; its shims keep running, as they do
// when a host's containerd is restarted) and starts it again on the same
// root, state and socket, then waits until it answers.
func (c *Containerd) Restart() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
	if err := c.launch(); err != nil {
		return err
	}
	return c.waitReady(30 * time.Second)
}

// config is the containerd configuration of this instance.
func (c *Containerd) config(version int, disabled []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "version = %d\n", version)
	fmt.Fprintf(&b, "root = %q\nstate = %q\n", filepath.Join(c.Dir, "root"), filepath.Join(c.Dir, "state"))
	fmt.Fprintf(&b, "disabled_plugins = [%s]\n", quoteList(disabled))
	fmt.Fprintf(&b, "[grpc]\n  address = %q\n", c.Address)
	fmt.Fprintf(&b, "[ttrpc]\n  address = %q\n", c.Address+".ttrpc")
	fmt.Fprintf(&b, "[debug]\n  level = \"debug\"\n")
	return b.String()
}

func quoteList(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// waitReady waits until containerd answers ctr.
func (c *Containerd) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-c.exited:
			return fmt.Errorf("containerd exited during start-up")
		default:
		}
		if conn, err := net.Dial("unix", c.Address); err == nil {
			conn.Close()
			if _, err := c.Ctr("version"); err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop ends containerd (SIGTERM, then SIGKILL) and removes its directory.
// Shims keep running when containerd stops; Stop kills the ones of this
// instance too. It is safe to call more than once.
func (c *Containerd) Stop() error {
	var err error
	c.stopOnce.Do(func() { err = c.stop() })
	return err
}

func (c *Containerd) stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.exited
	}
	c.killShims()
	_ = exec.Command("umount", "-R", "-l", c.Dir).Run()
	var errs []error
	if c.cri != nil {
		errs = append(errs, c.stopCRI())
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %v", c.Dir, err))
	}
	return errors.Join(errs...)
}

// killShims ends the shims left by this instance's users (their -address
// is this instance's socket): a shim finishing its shutdown (stopping its
// VM) gets time to do so, then SIGTERM, then SIGKILL.
func (c *Containerd) killShims() {
	for _, sig := range []syscall.Signal{0, syscall.SIGTERM, syscall.SIGKILL} {
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) && len(c.allShimPIDs()) > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		pids := c.allShimPIDs()
		if len(pids) == 0 {
			return
		}
		if sig != 0 && c.logf != nil {
			c.logf("shims %v still running at the end of the test: %v", pids, sig)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, sig)
		}
	}
}

// allShimPIDs lists this instance's shims of either runtime: Cocoon's and
// runc's (which only the bench starts).
func (c *Containerd) allShimPIDs() []int {
	return append(ShimPIDs(c.Address), ShimPIDsOf(RuncShimBinary, c.Address)...)
}

// RuncShimBinary is containerd's runc shim, io.containerd.runc.v2.
const RuncShimBinary = "containerd-shim-runc-v2"

// ShimPIDs lists the pids of the Cocoon shims started by the containerd at
// address.
func ShimPIDs(address string) []int { return ShimPIDsOf(ShimBinary, address) }

// ShimPIDsOf lists the pids of the shims named binary (a file name such as
// ShimBinary or RuncShimBinary) started by the containerd at address.
func ShimPIDsOf(binary, address string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != binary {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == address {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// Log is containerd's log so far.
func (c *Containerd) Log() string {
	data, _ := os.ReadFile(filepath.Join(c.Dir, "containerd.log"))
	return string(data)
}

// CtrCommand returns a ctr command against this instance in its
// namespace, bound to ctx.
func (c *Containerd) CtrCommand(ctx context.Context, args ...string) *exec.Cmd {
	return c.ctrCommandIn(ctx, c.Namespace, args...)
}

// ctrCommandIn is CtrCommand in namespace ns.
func (c *Containerd) ctrCommandIn(ctx context.Context, ns string, args ...string) *exec.Cmd {
	full := append([]string{"--address", c.Address, "--namespace", ns}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(c.Bin, "ctr"), full...)
	cmd.Env = append(os.Environ(), c.Env...)
	return cmd
}

// Ctr runs ctr with args (2 minutes at most) and returns its stdout. On
// failure the error carries stderr, and wraps the *exec.ExitError.
func (c *Containerd) Ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, stderr bytes.Buffer
	cmd := c.CtrCommand(ctx, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("ctr %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out.String(), err
}

// MustCtr is Ctr that fails the test on error; only for an instance that
// StartContainerd started.
func (c *Containerd) MustCtr(args ...string) string {
	c.t.Helper()
	out, err := c.Ctr(args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// PID is the containerd process's pid.
func (c *Containerd) PID() int { return c.cmd.Process.Pid }
