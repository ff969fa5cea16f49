// crictl for the integration tests: cri-tools v1.37.0, built from the Go
// module proxy by `make test-deps` (integration/install-cri-tools.sh)
// into /opt/cocoon-test/cri-tools-1.37 with critest next to it.
//
// A Crictl drives one CRI instance (WithCRI) through a crictl.yaml of its
// own, never the host's /etc/crictl.yaml. Configurations are written as
// JSON files (see criconfig.go) into its directory; PodConfig and
// ContainerConfig give ones the instance's pods can run with.

package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// criToolsDir holds the crictl and critest that `make test-deps` builds;
// COCOON_CRI_TOOLS names another directory holding them.
const (
	criToolsDir    = "/opt/cocoon-test/cri-tools-1.37/bin"
	criToolsEnvVar = "COCOON_CRI_TOOLS"
)

// ErrCRIToolsNotInstalled is returned by CRIToolsDir when crictl or
// critest is not on this machine; the tests skip on it.
var ErrCRIToolsNotInstalled = errors.New("cri-tools not installed")

// CRIToolsDir is the directory holding crictl and critest.
func CRIToolsDir() (string, error) {
	return testToolDir(criToolsDir, criToolsEnvVar, ErrCRIToolsNotInstalled, "crictl", "critest")
}

// testToolDir is the directory holding a test tool's binaries, which
// `make test-deps` installs into def, or the one the environment variable
// envVar names instead. When one of the binaries is not there, the error
// wraps missing and says which.
func testToolDir(def, envVar string, missing error, binaries ...string) (string, error) {
	dir := def
	if d := os.Getenv(envVar); d != "" {
		dir = d
	}
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%w: %v (make test-deps installs it; %s names another directory)", missing, err, envVar)
		}
	}
	return dir, nil
}

// Crictl runs crictl against one CRI instance.
type Crictl struct {
	// Bin is the crictl binary.
	Bin string
	// Config is its crictl.yaml: the instance's endpoint for runtime and
	// images, and Timeout.
	Config string
	// Dir holds Config, the configurations written for runp and create,
	// and the pods' log directories (PodConfig).
	Dir string
	// Timeout bounds each Run, and each CRI call crictl makes.
	Timeout time.Duration

	// t is the test that made it; c is the instance.
	t testing.TB
	c *Containerd
	// mu guards pods and seq.
	mu sync.Mutex
	// pods are the pods RunPod made and RemovePod did not remove, for
	// Cleanup.
	pods []string
	// seq numbers the files and names it makes.
	seq int
	// cleanOnce makes Cleanup run once; cleanErr is what it returned.
	cleanOnce sync.Once
	cleanErr  error
}

// NewCrictl returns a Crictl bound to c, which StartContainerd started
// WithCRI, and runs its Cleanup when the test ends, before c stops. It
// skips the test if crictl is not installed.
func NewCrictl(t testing.TB, c *Containerd) *Crictl {
	t.Helper()
	if c.cri == nil {
		t.Fatal("NewCrictl: containerd was started without WithCRI")
	}
	dir, err := CRIToolsDir()
	if errors.Is(err, ErrCRIToolsNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	x, err := newCrictl(c, filepath.Join(dir, "crictl"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	x.t = t
	t.Cleanup(func() {
		if err := x.Cleanup(); err != nil {
			t.Errorf("crictl cleanup: %v", err)
		}
	})
	return x
}

// Command returns a crictl command with args, bound to ctx.
func (x *Crictl) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, x.Bin, append([]string{"--config", x.Config}, args...)...)
	// Its own process group, so that a timeout ends what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// Run runs crictl with args for Timeout at most and returns its stdout
// and stderr. On failure the error carries stderr and wraps the
// *exec.ExitError.
func (x *Crictl) Run(args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), x.Timeout)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := x.Command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err = cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w after %v", ctx.Err(), x.Timeout)
		}
		err = fmt.Errorf("crictl %s: %w\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), errb.String(), err
}

// MustRun is Run that fails the test that made x on error and returns
// stdout.
func (x *Crictl) MustRun(args ...string) string {
	x.t.Helper()
	return x.must(x.t, args...)
}

func (x *Crictl) must(t testing.TB, args ...string) string {
	t.Helper()
	out, _, err := x.Run(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// next is a number for a name or file of x's.
func (x *Crictl) next() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.seq++
	return x.seq
}

// PodConfig is a pod configuration named name (in the Kubernetes
// namespace cocoon-test, with a uid of its own), whose containers' logs
// go to a directory of its own under Dir and whose cgroups are under the
// instance's cgroup parent (CRICgroupParent), which Stop removes.
func (x *Crictl) PodConfig(name string) *PodConfig {
	n := x.next()
	logs := filepath.Join(x.Dir, fmt.Sprintf("logs-%s-%d", name, n))
	// CRI makes it too; made here, a test may look at it before.
	_ = os.MkdirAll(logs, 0o755)
	return &PodConfig{
		Metadata:     PodMetadata{Name: name, Namespace: "cocoon-test", UID: fmt.Sprintf("%s-%d-%d", name, os.Getpid(), n)},
		Hostname:     name,
		LogDirectory: logs,
		Linux:        &PodLinux{CgroupParent: x.c.CRICgroupParent()},
	}
}

// ContainerConfig is a container configuration named name, of image,
// running command, logging to <name>.log in its pod's log directory.
func (x *Crictl) ContainerConfig(name, image string, command ...string) *ContainerConfig {
	return &ContainerConfig{
		Metadata: ContainerMetadata{Name: name},
		Image:    ImageSpec{Image: image},
		Command:  command,
		LogPath:  name + ".log",
	}
}

// writeConfig writes config as JSON into Dir and returns its path.
func (x *Crictl) writeConfig(t testing.TB, kind string, config any) string {
	t.Helper()
	path, err := x.WriteConfig(kind, config)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// RunPod runs a pod (crictl runp) of pod, a PodConfig or anything that
// marshals to a PodSandboxConfig, with the runtime handler handler (""
// for the default, runc), and returns its id. Cleanup removes it unless
// RemovePod did.
func (x *Crictl) RunPod(t testing.TB, pod any, handler string) string {
	t.Helper()
	args := []string{"runp"}
	if handler != "" {
		args = append(args, "--runtime", handler)
	}
	id := strings.TrimSpace(x.must(t, append(args, x.writeConfig(t, "pod", pod))...))
	x.mu.Lock()
	x.pods = append(x.pods, id)
	x.mu.Unlock()
	return id
}

// CreateContainer creates a container (crictl create) of ctr, a
// ContainerConfig or anything that marshals to one, in pod podID, which
// RunPod ran of pod, and returns its id. Its image must be there
// (ImportCRI): nothing is pulled.
func (x *Crictl) CreateContainer(t testing.TB, podID string, ctr, pod any) string {
	t.Helper()
	return strings.TrimSpace(x.must(t, "create", podID, x.writeConfig(t, "container", ctr), x.writeConfig(t, "pod", pod)))
}

// Start starts container id.
func (x *Crictl) Start(t testing.TB, id string) {
	t.Helper()
	x.must(t, "start", id)
}

// Stop stops container id: its stop signal, then SIGKILL after timeout
// seconds (0: at once).
func (x *Crictl) Stop(t testing.TB, id string, timeout int) {
	t.Helper()
	x.must(t, "stop", "--timeout", fmt.Sprint(timeout), id)
}

// Remove removes container id.
func (x *Crictl) Remove(t testing.TB, id string) {
	t.Helper()
	x.must(t, "rm", id)
}

// Exec runs cmd in container id through the instance's stream server
// (crictl exec) and returns its stdout.
func (x *Crictl) Exec(t testing.TB, id string, cmd ...string) string {
	t.Helper()
	return x.must(t, append([]string{"exec", id}, cmd...)...)
}

// ExecSync runs cmd in container id with the CRI's ExecSync (crictl exec
// -s) and returns its stdout.
func (x *Crictl) ExecSync(t testing.TB, id string, cmd ...string) string {
	t.Helper()
	return x.must(t, append([]string{"exec", "-s", id}, cmd...)...)
}

// Logs is container id's log (crictl logs): what it wrote to stdout and
// to stderr.
func (x *Crictl) Logs(t testing.TB, id string) (stdout, stderr string) {
	t.Helper()
	stdout, stderr, err := x.Run("logs", id)
	if err != nil {
		t.Fatal(err)
	}
	return stdout, stderr
}

// Inspect is container id's status (crictl inspect -o json).
func (x *Crictl) Inspect(t testing.TB, id string) ContainerInspect {
	t.Helper()
	var v ContainerInspect
	x.decode(t, &v, "inspect", "-o", "json", id)
	return v
}

// InspectPod is pod id's status (crictl inspectp -o json).
func (x *Crictl) InspectPod(t testing.TB, id string) PodInspect {
	t.Helper()
	var v PodInspect
	x.decode(t, &v, "inspectp", "-o", "json", id)
	return v
}

func (x *Crictl) decode(t testing.TB, v any, args ...string) {
	t.Helper()
	out := x.must(t, args...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("crictl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// StopPod stops pod id (crictl stopp): its containers, its sandbox, its
// network.
func (x *Crictl) StopPod(t testing.TB, id string) {
	t.Helper()
	x.must(t, "stopp", id)
}

// RemovePod removes pod id (crictl rmp), which StopPod stopped.
func (x *Crictl) RemovePod(t testing.TB, id string) {
	t.Helper()
	x.must(t, "rmp", id)
	x.mu.Lock()
	x.pods = slices.DeleteFunc(x.pods, func(p string) bool { return p == id })
	x.mu.Unlock()
}

// Cleanup stops and removes every pod RunPod made that RemovePod did not
// remove, with their containers. It is safe to call more than once.
func (x *Crictl) Cleanup() error {
	x.cleanOnce.Do(func() { x.cleanErr = x.cleanup() })
	return x.cleanErr
}

func (x *Crictl) cleanup() error {
	x.mu.Lock()
	pods := slices.Clone(x.pods)
	x.pods = nil
	x.mu.Unlock()
	var errs []error
	for _, id := range slices.Backward(pods) {
		if _, _, err := x.Run("stopp", id); err != nil {
			errs = append(errs, err)
		}
		if _, _, err := x.Run("rmp", "--force", id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
