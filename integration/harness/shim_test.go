package harness_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
	"github.com/cocoonrt/cocoon/runtime/image"
)

// The shim against real containerd, driven with its own ctr: the
// bootstrap of each containerd version, the Task API end to end in real
// VMs, grouping, and the clean-up after a shim that was SIGKILLed.
//
// Needs root, QEMU and a guest image (COCOON_IMAGE_DIR, as `make
// test-integration` sets it); other COCOON_* settings are passed on to
// the shim.

const runtimeName = "io.containerd.cocoon.v2"

// versions are the containerds tested; one that is not installed is
// skipped (see harness.StartContainerd for where each is looked for).
var versions = []string{"1.6", "1.7", "2.4"}

// shimEnv gives the shims private state and data directories and an empty
// config file, and passes on the test's COCOON_* settings (image, QEMU).
func shimEnv(t *testing.T) (opts []harness.Option, stateDir string) {
	t.Helper()
	if os.Getenv("COCOON_IMAGE_DIR") == "" {
		t.Skip("COCOON_IMAGE_DIR is not set: no guest image to boot (run through make test-integration)")
	}
	root := t.TempDir()
	stateDir = filepath.Join(root, "run")
	cfg := filepath.Join(root, "config.toml")
	if err := os.WriteFile(cfg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	kv := []string{"COCOON_CONFIG=" + cfg, "COCOON_STATE_DIR=" + stateDir, "COCOON_DATA_DIR=" + filepath.Join(root, "lib")}
	for _, e := range os.Environ() {
		name, _, _ := strings.Cut(e, "=")
		switch name {
		case "COCOON_CONFIG", "COCOON_STATE_DIR", "COCOON_DATA_DIR":
		default:
			if strings.HasPrefix(name, "COCOON_") {
				kv = append(kv, e)
			}
		}
	}
	t.Cleanup(func() { assertNoSandbox(t, stateDir) })
	return []harness.Option{harness.WithEnv(kv...)}, stateDir
}

// assertNoSandbox fails t if a sandbox's state or QEMU remains.
func assertNoSandbox(t *testing.T, stateDir string) {
	t.Helper()
	if out, err := exec.Command("pgrep", "-a", "-f", "qemu-system.*"+stateDir).Output(); err == nil {
		t.Errorf("QEMU still running after the test:\n%s", out)
	}
	ents, _ := filepath.Glob(filepath.Join(stateDir, "*", "*"))
	if len(ents) > 0 {
		t.Errorf("sandbox state left behind: %v", ents)
	}
}

// startContainerd starts containerd version; StartContainerd skips the
// test if that version is not installed.
func startContainerd(t *testing.T, version string, opts ...harness.Option) *harness.Containerd {
	t.Helper()
	return harness.StartContainerd(t, version, opts...)
}

// TestShimRun runs a command in a microVM with `ctr run --rm` and checks
// the output, the exit status and that nothing is left.
func TestShimRun(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			opts, _ := shimEnv(t)
			c := startContainerd(t, v, opts...)
			img := harness.ImportBusybox(t, c)
			events := watchEvents(t, c)
			var stdout, stderr bytes.Buffer
			cmd := c.CtrCommand(context.Background(), "run", "--rm", "--runtime", runtimeName, img, "run1",
				"/bin/sh", "-c", "uname -r; echo to-stderr >&2; exit 3")
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 3 {
				t.Fatalf("ctr run: want exit status 3, got %v\n%s%s", err, stdout.String(), stderr.String())
			}
			img2, err := image.Open(os.Getenv("COCOON_IMAGE_DIR"))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(stdout.String()); got != img2.Manifest.Kernel.Release {
				t.Errorf("stdout %q is not the guest kernel's release %q", got, img2.Manifest.Kernel.Release)
			}
			if !strings.Contains(stderr.String(), "to-stderr\n") || strings.Contains(stdout.String(), "to-stderr") {
				t.Errorf("stderr %q: want the process's stderr there and only there", stderr.String())
			}
			waitNoShim(t, c)
			want := []string{"/tasks/create", "/tasks/start", "/tasks/exit", "/tasks/delete"}
			if got := events(); !reflect.DeepEqual(got, want) {
				t.Errorf("containerd received task events %v, want %v", got, want)
			}
			// Which bootstrap protocol start detected (its log line).
			wantProto := map[string]string{"1.6": "bare address", "1.7": "json", "2.4": "bootstrap protobuf"}[v]
			m := regexp.MustCompile(`msg="shim start".*protocol="([^"]*)"`).FindStringSubmatch(c.Log())
			if m == nil || !strings.HasPrefix(m[1], wantProto) {
				t.Errorf("containerd %s: start detected %v, want %q", v, m, wantProto)
			} else {
				t.Logf("containerd %s: start answered in %s", v, m[1])
			}
		})
	}
}

// TestShimLifecycle drives one container through the Task API: start,
// state, exec, ps, pause, resume, checkpoint (not implemented), kill,
// delete.
func TestShimLifecycle(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			opts, _ := shimEnv(t)
			c := startContainerd(t, v, opts...)
			img := harness.ImportBusybox(t, c)
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "life", "sleep", "600")
			waitStatus(t, c, "life", "RUNNING")
			if out := c.MustCtr("task", "exec", "--exec-id", "e1", "life", "/bin/echo", "from-exec"); strings.TrimSpace(out) != "from-exec" {
				t.Errorf("exec output %q", out)
			}
			var catOut bytes.Buffer
			cat := c.CtrCommand(context.Background(), "task", "exec", "--exec-id", "e2", "life", "/bin/cat")
			cat.Stdin, cat.Stdout = strings.NewReader("through stdin\n"), &catOut
			if err := cat.Run(); err != nil || catOut.String() != "through stdin\n" {
				t.Errorf("exec cat with stdin: %q, %v", catOut.String(), err)
			}
			if out := c.MustCtr("task", "ps", "life"); !regexp.MustCompile(`(?m)^\s*\d+\s`).MatchString(out) {
				t.Errorf("task ps lists no process:\n%s", out)
			}
			c.MustCtr("task", "pause", "life")
			waitStatus(t, c, "life", "PAUSED")
			c.MustCtr("task", "resume", "life")
			waitStatus(t, c, "life", "RUNNING")
			_, err := c.Ctr("task", "checkpoint", "life")
			if err == nil || !strings.Contains(err.Error(), "checkpoint is not implemented yet in cocoon") {
				t.Errorf("checkpoint: %v", err)
			}
			c.MustCtr("task", "kill", "-s", "SIGKILL", "life")
			waitStatus(t, c, "life", "STOPPED")
			c.MustCtr("task", "rm", "life")
			c.MustCtr("container", "rm", "life")
			waitNoShim(t, c)
		})
	}
}

// TestShimGrouping: a pod's containers (CRI's annotations) share the shim
// and the VM of the pod's sandbox container.
func TestShimGrouping(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			opts, stateDir := shimEnv(t)
			c := startContainerd(t, v, opts...)
			img := harness.ImportBusybox(t, c)
			c.MustCtr("run", "-d", "--runtime", runtimeName,
				"--annotation", "io.kubernetes.cri.container-type=sandbox",
				"--annotation", "io.kubernetes.cri.sandbox-id=pod1", img, "pod1", "sleep", "600")
			c.MustCtr("run", "-d", "--runtime", runtimeName,
				"--annotation", "io.kubernetes.cri.container-type=container",
				"--annotation", "io.kubernetes.cri.sandbox-id=pod1", img, "app1", "sleep", "600")
			waitStatus(t, c, "app1", "RUNNING")
			if pids := harness.ShimPIDs(c.Address); len(pids) != 1 {
				t.Errorf("%d shims for one pod, want 1", len(pids))
			}
			if ents, _ := filepath.Glob(filepath.Join(stateDir, c.Namespace, "*")); len(ents) != 1 {
				t.Errorf("sandboxes %v, want only pod1", ents)
			}
			for _, id := range []string{"app1", "pod1"} {
				c.MustCtr("task", "kill", "-s", "SIGKILL", id)
				waitStatus(t, c, id, "STOPPED")
				c.MustCtr("task", "rm", id)
				c.MustCtr("container", "rm", id)
			}
			waitNoShim(t, c)
		})
	}
}

// TestShimKilled SIGKILLs a shim: containerd runs `shim delete`, which must
// stop the orphaned VM and remove the sandbox's state.
func TestShimKilled(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			opts, stateDir := shimEnv(t)
			c := startContainerd(t, v, opts...)
			img := harness.ImportBusybox(t, c)
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "victim", "sleep", "600")
			waitStatus(t, c, "victim", "RUNNING")
			pids := harness.ShimPIDs(c.Address)
			if len(pids) != 1 {
				t.Fatalf("shims: %v", pids)
			}
			if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				_, err := os.Stat(filepath.Join(stateDir, c.Namespace, "victim"))
				if os.IsNotExist(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sandbox state still there 30 s after its shim was killed")
				}
				time.Sleep(200 * time.Millisecond)
			}
			if out, err := c.Ctr("task", "ls"); err != nil || strings.Contains(out, "RUNNING") {
				t.Errorf("task ls after the shim died: %v\n%s", err, out)
			}
			c.Ctr("task", "rm", "-f", "victim")
			c.MustCtr("container", "rm", "victim")
		})
	}
}

// watchEvents subscribes to containerd's events with ctr; the returned
// func stops and returns the task topics seen, in order.
func watchEvents(t *testing.T, c *harness.Containerd) func() []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	cmd := c.CtrCommand(ctx, "events")
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // subscribed
	t.Cleanup(cancel)
	return func() []string {
		time.Sleep(300 * time.Millisecond) // the last event arrived
		cancel()
		_ = cmd.Wait()
		var topics []string
		for _, f := range strings.Fields(out.String()) {
			if strings.HasPrefix(f, "/tasks/") {
				topics = append(topics, f)
			}
		}
		return topics
	}
}

// waitStatus waits for ctr task ls to show id in status.
func waitStatus(t *testing.T, c *harness.Containerd, id, status string) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(id) + `\s+\d+\s+` + status + `\s*$`)
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := c.Ctr("task", "ls")
		if err == nil && re.MatchString(out) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not %s after 60 s:\n%s %v", id, status, out, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitNoShim waits for the instance's shims to exit (the last Delete stops
// the VM, then Shutdown ends the shim).
func waitNoShim(t *testing.T, c *harness.Containerd) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(harness.ShimPIDs(c.Address)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("shim still running: %v", harness.ShimPIDs(c.Address))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
