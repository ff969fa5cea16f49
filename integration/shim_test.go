package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/integration/harness"
	"github.com/cocoonrt/cocoon/runtime/image"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The shim against real containerd, driven with its own ctr as a user
// would: the bootstrap of each containerd version, the Task API end to end
// in real VMs (TTY, signals and exit codes, stats and update, OOM, large
// output, restart), grouping, refused options, and the clean-up after a
// shim that was SIGKILLed. Every test checks at its end that no QEMU,
// shim or sandbox state is left.

const runtimeName = "io.containerd.cocoon.v2"

// allVersions are the containerds the bootstrap and lifecycle tests run
// against; one that is not installed is skipped (see
// harness.StartContainerd for where each is looked for). versions, the
// oldest and the newest, are enough for the other tests: they exercise
// the Task API, which 1.7 speaks as 1.6 does.
var (
	allVersions = []string{"1.6", "1.7", "2.4"}
	versions    = []string{"1.6", "2.4"}
)

// shimContainerd starts containerd version with the busybox image
// imported and shims that have private state and data directories, an
// empty config file and the test's COCOON_* settings (image, QEMU,
// COCOON_TEMPLATE, which is "never" unless the test set it). When
// the test ends it checks that no QEMU or sandbox state of these shims
// remains.
func shimContainerd(t *testing.T, version string) (c *harness.Containerd, img, stateDir string) {
	t.Helper()
	root := t.TempDir()
	stateDir = filepath.Join(root, "run")
	cfg := filepath.Join(root, "config.toml")
	if err := os.WriteFile(cfg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Sandboxes boot unless a test sets COCOON_TEMPLATE itself: a
	// template made in the background (auto mode) would boot a VM of
	// its own while the test runs (template_test.go tests them). Nor
	// are spares made unless a test sets COCOON_TEMPLATE_SPARE: each
	// start from a template would leave one behind
	// (template_spare_test.go tests them).
	kv := []string{"COCOON_CONFIG=" + cfg, "COCOON_STATE_DIR=" + stateDir, "COCOON_DATA_DIR=" + filepath.Join(root, "lib"),
		"COCOON_TEMPLATE=never", "COCOON_TEMPLATE_SPARE=false"}
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
	// Registered first, so it runs last: after containerd and its shims
	// were stopped.
	t.Cleanup(func() { assertClean(t, stateDir) })
	c = harness.StartContainerd(t, version, harness.WithEnv(kv...))
	return c, harness.ImportBusybox(t, c), stateDir
}

// removeAtEnd removes the containers ids (and their tasks) when the test
// ends, whatever state they are in, so that a failed test leaves nothing.
func removeAtEnd(t *testing.T, c *harness.Containerd, ids ...string) {
	t.Cleanup(func() {
		for _, id := range ids {
			_, _ = c.Ctr("task", "kill", "-s", "SIGKILL", id)
			_, _ = c.Ctr("task", "rm", "-f", id)
			_, _ = c.Ctr("container", "rm", id)
		}
	})
}

// exitCode is the exit status of a command that ran, or -1 with the error
// for one that could not.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}

// TestShimRun runs a command in a microVM with `ctr run --rm` and checks
// the output, the exit status, the task events and that nothing is left.
func TestShimRun(t *testing.T) {
	for _, v := range allVersions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			events := c.WatchEvents(t)
			var stdout, stderr bytes.Buffer
			cmd := c.CtrCommand(context.Background(), "run", "--rm", "--runtime", runtimeName, img, "run1",
				"/bin/sh", "-c", "uname -r; echo to-stderr >&2; exit 3")
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); exitCode(err) != 3 {
				t.Fatalf("ctr run: want exit status 3, got %v\n%s%s", err, stdout.String(), stderr.String())
			}
			gi, err := image.Open(testEnv.imageDir)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(stdout.String()); got != gi.Manifest.Kernel.Release {
				t.Errorf("stdout %q is not the guest kernel's release %q", got, gi.Manifest.Kernel.Release)
			}
			if !strings.Contains(stderr.String(), "to-stderr\n") || strings.Contains(stdout.String(), "to-stderr") {
				t.Errorf("stderr %q: want the process's stderr there and only there", stderr.String())
			}
			c.WaitNoShim(t)
			want := []string{"/tasks/create", "/tasks/start", "/tasks/exit", "/tasks/delete"}
			if got := events.Stop(); !reflect.DeepEqual(got, want) {
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
// state, exec (with stdin), ps, pause, resume, kill, delete
// (checkpoint_test.go checkpoints).
func TestShimLifecycle(t *testing.T) {
	for _, v := range allVersions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "life")
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "life", "sleep", "600")
			c.WaitStatus(t, "life", "RUNNING")
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
			c.WaitStatus(t, "life", "PAUSED")
			c.MustCtr("task", "resume", "life")
			c.WaitStatus(t, "life", "RUNNING")
			killAndRemove(t, c, "life")
		})
	}
}

// TestShimGrouping: a pod's containers (CRI's annotations) share the shim
// and the VM of the pod's sandbox container.
func TestShimGrouping(t *testing.T) {
	for _, v := range allVersions {
		t.Run(v, func(t *testing.T) {
			c, img, stateDir := shimContainerd(t, v)
			removeAtEnd(t, c, "app1", "pod1")
			c.MustCtr("run", "-d", "--runtime", runtimeName,
				"--annotation", "io.kubernetes.cri.container-type=sandbox",
				"--annotation", "io.kubernetes.cri.sandbox-id=pod1", img, "pod1", "sleep", "600")
			c.MustCtr("run", "-d", "--runtime", runtimeName,
				"--annotation", "io.kubernetes.cri.container-type=container",
				"--annotation", "io.kubernetes.cri.sandbox-id=pod1", img, "app1", "sleep", "600")
			c.WaitStatus(t, "app1", "RUNNING")
			if pids := harness.ShimPIDs(c.Address); len(pids) != 1 {
				t.Errorf("%d shims for one pod, want 1", len(pids))
			}
			if ents, _ := filepath.Glob(filepath.Join(stateDir, c.Namespace, "*")); len(ents) != 1 {
				t.Errorf("sandboxes %v, want only pod1", ents)
			}
			killAndRemove(t, c, "app1", "pod1")
		})
	}
}

// TestShimKilled SIGKILLs a shim: containerd runs `shim delete`, which must
// stop the orphaned VM and remove the sandbox's state.
func TestShimKilled(t *testing.T) {
	for _, v := range allVersions {
		t.Run(v, func(t *testing.T) {
			c, img, stateDir := shimContainerd(t, v)
			removeAtEnd(t, c, "victim")
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "victim", "sleep", "600")
			c.WaitStatus(t, "victim", "RUNNING")
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
			leakAudit(t, c, filepath.Dir(stateDir))
		})
	}
}

// TestShimTTY runs `ctr run -t` on a pseudo-terminal, as from a shell: the
// process gets a terminal of the host terminal's size, its output arrives,
// what is typed reaches it, and its exit status comes back.
func TestShimTTY(t *testing.T) {
	for _, v := range allVersions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "tty1")
			master, slave, err := harness.OpenPty(33, 117)
			if err != nil {
				t.Fatal(err)
			}
			defer master.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := c.CtrCommand(ctx, "run", "-t", "--rm", "--runtime", runtimeName, img, "tty1",
				"/bin/sh", "-c", `tty; stty size; test -t 0 && echo stdin-is-a-tty; echo ready; read line; echo "got:$line"; exit 5`)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			slave.Close()
			// The output, read until ctr exits (EIO once the slave is closed).
			var mu sync.Mutex
			var out bytes.Buffer
			ready := make(chan struct{})
			readDone := make(chan struct{})
			go func() {
				defer close(readDone)
				buf := make([]byte, 4096)
				signalled := false
				for {
					n, err := master.Read(buf)
					mu.Lock()
					out.Write(buf[:n])
					if !signalled && strings.Contains(strings.ReplaceAll(out.String(), "\r", ""), "ready\n") {
						signalled = true
						close(ready)
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			}()
			select {
			case <-ready:
			case <-time.After(90 * time.Second):
				mu.Lock()
				t.Fatalf("no prompt from the container on the tty after 90 s; output so far: %q", out.String())
			}
			if _, err := master.Write([]byte("typed-in\r")); err != nil {
				t.Fatal(err)
			}
			err = cmd.Wait()
			select {
			case <-readDone:
			case <-time.After(5 * time.Second):
			}
			mu.Lock()
			got := out.String()
			mu.Unlock()
			t.Logf("tty output: %q", got)
			if exitCode(err) != 5 {
				t.Errorf("ctr run -t: want exit status 5, got %v", err)
			}
			// The guest's terminal, and maybe the host's, write \n as \r\n.
			lines := strings.Split(strings.ReplaceAll(got, "\r", ""), "\n")
			// ctr may print warnings first (2.4: cgroup v1 is deprecated).
			if !regexp.MustCompile(`(?m)^/dev/(pts/\d+|console)$`).MatchString(strings.Join(lines, "\n")) {
				t.Errorf("tty printed %q, want a terminal device", lines)
			}
			for _, want := range []string{"\n33 117\n", "\nstdin-is-a-tty\n", "\ngot:typed-in\n"} {
				if !strings.Contains("\n"+strings.Join(lines, "\n"), want) {
					t.Errorf("tty output lacks %q", strings.TrimSpace(want))
				}
			}
			c.WaitNoShim(t)
		})
	}
}

// metric reads one value from `ctr task metrics` (a table of METRIC VALUE
// lines), and fails t if it is absent.
func metric(t *testing.T, table, name string) uint64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+(\d+)\s*$`).FindStringSubmatch(table)
	if m == nil {
		t.Fatalf("no %s in the metrics:\n%s", name, table)
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	return n
}

// TestShimStatsUpdate reads a container's metrics (from the guest's
// cgroup) and changes its memory limit with `ctr task update`: the new
// limit is what the container's cgroup and the metrics show.
func TestShimStatsUpdate(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "st")
			// ctr's default spec mounts no cgroup filesystem: one for the
			// check that update reached the container's cgroup.
			c.MustCtr("run", "-d", "--runtime", runtimeName, "--memory-limit", "134217728",
				"--mount", "type=cgroup2,src=cgroup2,dst=/sys/fs/cgroup,options=ro:nosuid:nodev:noexec",
				img, "st", "sh", "-c", "sleep 600 & sleep 600 & wait")
			c.WaitStatus(t, "st", "RUNNING")
			waitPids(t, c, "st", 3)
			table := c.MustCtr("task", "metrics", "st")
			if n := metric(t, table, "pids.current"); n < 3 {
				t.Errorf("pids.current = %d, want sh and its two sleeps at least", n)
			}
			if n := metric(t, table, "memory.usage"); n == 0 {
				t.Errorf("memory.usage = 0")
			}
			if n := metric(t, table, "memory.usage_limit"); n != 134217728 {
				t.Errorf("memory.usage_limit = %d, want the --memory-limit 134217728", n)
			}
			// ctr has no task update: containerd's Tasks API, as its Go
			// client (nerdctl update, CRI's UpdateContainerResources) calls it.
			limit := int64(67108864)
			if err := c.UpdateTask(context.Background(), "st", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}); err != nil {
				t.Fatal(err)
			}
			// The container's own cgroup, wherever runc mounted it.
			readMax := `f=/sys/fs/cgroup/memory.max; [ -e $f ] || f=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/memory.max; cat $f`
			if out := c.MustCtr("task", "exec", "--exec-id", "max", "st", "sh", "-c", readMax); strings.TrimSpace(out) != "67108864" {
				t.Errorf("memory.max in the container after update: %q, want 67108864", out)
			}
			if n := metric(t, c.MustCtr("task", "metrics", "st"), "memory.usage_limit"); n != 67108864 {
				t.Errorf("memory.usage_limit after update = %d, want 67108864", n)
			}
			killAndRemove(t, c, "st")
		})
	}
}

// waitPids waits (60 s at most) for `ctr task ps` to list n processes of
// container id.
func waitPids(t *testing.T, c *harness.Containerd, id string, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out := c.MustCtr("task", "ps", id)
		if got := len(regexp.MustCompile(`(?m)^\s*\d+\s`).FindAllString(out, -1)); got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task ps %s: want %d processes after 60 s:\n%s", id, n, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestShimParallel starts two containers at once: two shims, two VMs, both
// running and answering an exec, both removed cleanly.
func TestShimParallel(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, stateDir := shimContainerd(t, v)
			ids := []string{"par1", "par2"}
			removeAtEnd(t, c, ids...)
			errs := make(chan error, len(ids))
			for _, id := range ids {
				go func() {
					_, err := c.Ctr("run", "-d", "--runtime", runtimeName, img, id, "sleep", "600")
					errs <- err
				}()
			}
			for range ids {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for _, id := range ids {
				c.WaitStatus(t, id, "RUNNING")
			}
			if pids := harness.ShimPIDs(c.Address); len(pids) != 2 {
				t.Errorf("shims %v, want one per container", pids)
			}
			if out, _ := exec.Command("pgrep", "-f", "qemu-system.*"+stateDir).Output(); len(strings.Fields(string(out))) != 2 {
				t.Errorf("QEMUs %q, want one per container", out)
			}
			for _, id := range ids {
				if out := c.MustCtr("task", "exec", "--exec-id", "hello", id, "echo", "in-"+id); strings.TrimSpace(out) != "in-"+id {
					t.Errorf("exec in %s: %q", id, out)
				}
			}
			killAndRemove(t, c, ids...)
		})
	}
}

// TestShimRestart starts a new task in a container whose task exited and
// was deleted, three times: after `ctr run` (which deletes the task
// itself), detached, and after `ctr task rm`. What each task wrote to its
// root is there for the next, as with runc: the writable layer goes back
// to the snapshot's upperdir when the task is deleted.
func TestShimRestart(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "again")
			run := func(what, want string, args ...string) {
				t.Helper()
				var out, stderr bytes.Buffer
				cmd := c.CtrCommand(context.Background(), args...)
				cmd.Stdout, cmd.Stderr = &out, &stderr
				if err := cmd.Run(); exitCode(err) != 4 {
					t.Fatalf("%s: ctr %v: want exit status 4, got %v\n%s", what, args, err, stderr.String())
				}
				if got := strings.TrimSpace(out.String()); got != want {
					t.Errorf("%s: output %q, want %q", what, got, want)
				}
			}
			// Each run appends to a file in the container's root: what a
			// task wrote is there for the next task on the snapshot.
			run("first run", "started 1", "run", "--runtime", runtimeName, img, "again",
				"sh", "-c", "echo x >> /runs; echo started $(wc -l < /runs); exit 4")
			run("task start after ctr run", "started 2", "task", "start", "again")
			c.MustCtr("task", "start", "-d", "again")
			c.WaitStatus(t, "again", "STOPPED")
			c.MustCtr("task", "rm", "again")
			run("task start after task rm", "started 4", "task", "start", "again")
			c.MustCtr("container", "rm", "again")
			c.WaitNoShim(t)
		})
	}
}

// attached is a `ctr run` or `ctr task exec` running in the background.
type attached struct {
	cmd  *exec.Cmd
	out  *lineWaiter
	done chan error
}

// startAttached starts ctr with args in the background; the test's end
// kills it if it still runs.
func startAttached(t *testing.T, c *harness.Containerd, args ...string) *attached {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := &attached{cmd: c.CtrCommand(ctx, args...), out: newLineWaiter(), done: make(chan error, 1)}
	a.cmd.Stdout = a.out
	a.cmd.Stderr = a.out
	if err := a.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() { a.done <- a.cmd.Wait() }()
	t.Cleanup(cancel)
	return a
}

// exitStatus waits (60 s at most) for ctr to exit and returns its status.
func (a *attached) exitStatus(t *testing.T) int {
	t.Helper()
	select {
	case err := <-a.done:
		return exitCode(err)
	case <-time.After(60 * time.Second):
		t.Fatalf("ctr %v still running after 60 s; output: %q", a.cmd.Args, a.out.String())
		return 0
	}
}

// lineWaiter collects a command's output and lets a test wait for a line.
type lineWaiter struct {
	// mu guards buf.
	mu  sync.Mutex
	buf bytes.Buffer
}

func newLineWaiter() *lineWaiter { return &lineWaiter{} }

func (w *lineWaiter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *lineWaiter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// waitLine waits (60 s at most) for line in the output.
func (w *lineWaiter) waitLine(t *testing.T, line string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains("\n"+w.String(), "\n"+line+"\n") {
		if time.Now().After(deadline) {
			t.Fatalf("no line %q after 60 s; output: %q", line, w.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestShimSignals: the exit status of a task killed by SIGKILL (137), of
// one that traps SIGTERM and exits 42, and `ctr task kill --all` reaching
// an exec'd process as well as the init.
func TestShimSignals(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "sigkill", "sigterm", "killall")
			events := c.WatchEvents(t)

			// SIGKILL: 128+9, from ctr run and in the exit event.
			k := startAttached(t, c, "run", "--runtime", runtimeName, img, "sigkill", "sh", "-c", "echo up; exec sleep 600")
			k.out.waitLine(t, "up")
			c.MustCtr("task", "kill", "-s", "SIGKILL", "sigkill")
			if code := k.exitStatus(t); code != 137 {
				t.Errorf("SIGKILLed task: ctr run exit status %d, want 137", code)
			}
			if !events.WaitFor("/tasks/exit", `"exit_status":137`, 10*time.Second) {
				t.Errorf("no /tasks/exit with exit_status 137: %v", events.Seen("/tasks/exit"))
			}
			c.MustCtr("container", "rm", "sigkill")

			// SIGTERM (ctr task kill's default) reaches the init's trap.
			term := startAttached(t, c, "run", "--runtime", runtimeName, img, "sigterm",
				"sh", "-c", `trap "exit 42" TERM; echo trapped; while true; do sleep 0.2; done`)
			term.out.waitLine(t, "trapped")
			c.MustCtr("task", "kill", "sigterm")
			if code := term.exitStatus(t); code != 42 {
				t.Errorf("SIGTERM trapped with exit 42: ctr run exit status %d; output %q", code, term.out.String())
			}
			c.MustCtr("container", "rm", "sigterm")

			// --all: the exec'd process is killed too.
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "killall", "sleep", "600")
			c.WaitStatus(t, "killall", "RUNNING")
			ex := startAttached(t, c, "task", "exec", "--exec-id", "sleeper", "killall", "sh", "-c", "echo exec-up; exec sleep 600")
			ex.out.waitLine(t, "exec-up")
			c.MustCtr("task", "kill", "--all", "-s", "SIGKILL", "killall")
			if code := ex.exitStatus(t); code != 137 {
				t.Errorf("exec'd process after kill --all: ctr task exec exit status %d, want 137", code)
			}
			c.WaitStatus(t, "killall", "STOPPED")
			c.MustCtr("task", "rm", "killall")
			c.MustCtr("container", "rm", "killall")
			c.WaitNoShim(t)
		})
	}
}

// TestShimLargeOutput checks that 100 MiB written by a container arrive
// through ctr byte-exact.
func TestShimLargeOutput(t *testing.T) {
	const size = 100 << 20
	line := []byte("0123456789abcdefghijklmnopqrstu\n") // 32 bytes: size is a multiple
	want := sha256.New()
	for i := 0; i < size/len(line); i++ {
		want.Write(line)
	}
	wantSum := fmt.Sprintf("%x", want.Sum(nil))
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "big")
			h := sha256.New()
			var n countWriter
			var stderr bytes.Buffer
			cmd := c.CtrCommand(context.Background(), "run", "--rm", "--runtime", runtimeName, img, "big",
				"sh", "-c", fmt.Sprintf("yes %s | head -c %d", strings.TrimSpace(string(line)), size))
			cmd.Stdout, cmd.Stderr = io.MultiWriter(h, &n), &stderr
			start := time.Now()
			if err := cmd.Run(); err != nil {
				t.Fatalf("ctr run: %v\n%s", err, stderr.String())
			}
			t.Logf("%d bytes in %v", n, time.Since(start).Round(time.Millisecond))
			if n != size {
				t.Errorf("got %d bytes, want %d", n, size)
			}
			if got := fmt.Sprintf("%x", h.Sum(nil)); got != wantSum {
				t.Errorf("sha256 of the output %s, want %s", got, wantSum)
			}
			c.WaitNoShim(t)
		})
	}
}

// countWriter counts the bytes written to it.
type countWriter int64

func (w *countWriter) Write(p []byte) (int, error) { *w += countWriter(len(p)); return len(p), nil }

// TestShimOOM runs a process that needs more memory than the container's
// limit: the guest kernel kills it, containerd gets /tasks/oom before
// /tasks/exit, and the task exits 137.
func TestShimOOM(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "oom")
			events := c.WatchEvents(t)
			var out bytes.Buffer
			cmd := c.CtrCommand(context.Background(), "run", "--rm", "--runtime", runtimeName,
				"--memory-limit", "16777216", img, "oom",
				// dd's 64 MiB buffer is filled from /dev/zero: 64 MiB resident.
				"dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1")
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); exitCode(err) != 137 {
				t.Errorf("ctr run over its memory limit: want exit status 137, got %v\n%s", err, out.String())
			}
			if !events.WaitFor("/tasks/oom", `"container_id":"oom"`, 10*time.Second) {
				t.Errorf("no /tasks/oom event for the container; events: %v", events.Seen("/"))
			}
			// containerd's order: the OOM before the exit it caused.
			var order []string
			for _, e := range events.Seen("/tasks/") {
				if e.Topic == "/tasks/oom" || e.Topic == "/tasks/exit" {
					order = append(order, e.Topic)
				}
			}
			if len(order) < 2 || order[0] != "/tasks/oom" || order[len(order)-1] != "/tasks/exit" {
				t.Errorf("task events %v: want /tasks/oom before /tasks/exit", order)
			}
			c.WaitNoShim(t)
		})
	}
}

// TestShimRefusedOptions: options that need the host's namespaces fail at
// create with a message that names them, and leave no VM, shim or state.
func TestShimRefusedOptions(t *testing.T) {
	cases := []struct {
		args []string
		// want is in the error ctr prints.
		want string
	}{
		{[]string{"--net-host"}, "--net=host"},
		{[]string{"--with-ns", "pid:/proc/1/ns/pid"}, "/proc/1/ns/pid"},
	}
	for _, v := range allVersions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "refused")
			for _, tc := range cases {
				args := append(append([]string{"run", "--rm", "--runtime", runtimeName}, tc.args...), img, "refused", "true")
				_, err := c.Ctr(args...)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("ctr run %v: want an error naming %q, got %v", tc.args, tc.want, err)
				}
				if out := c.MustCtr("container", "ls", "-q"); strings.TrimSpace(out) != "" {
					t.Errorf("containers left after ctr run %v: %q", tc.args, out)
				}
				c.WaitNoShim(t)
			}
		})
	}
}

// killAndRemove SIGKILLs the tasks of ids (all first, then waits), removes
// them and their containers, and waits until no shim is left.
func killAndRemove(t *testing.T, c *harness.Containerd, ids ...string) {
	t.Helper()
	for _, id := range ids {
		c.MustCtr("task", "kill", "-s", "SIGKILL", id)
	}
	for _, id := range ids {
		c.WaitStatus(t, id, "STOPPED")
		c.MustCtr("task", "rm", id)
		c.MustCtr("container", "rm", id)
	}
	c.WaitNoShim(t)
}

// TestShimRootfsDir runs a container on a root directory of the host's,
// not a snapshot (`ctr run --rootfs`, which sets an absolute root.path and
// no PATH): the directory is the container's root, read through a layer
// image, and what the container wrote is applied to the directory when its
// task is deleted, as if it had written there directly, as with runc.
func TestShimRootfsDir(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, _, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "dirroot")
			dir := filepath.Join(t.TempDir(), "root")
			if err := agenttest.MakeBusyboxRoot(dir); err != nil {
				t.Fatal(err)
			}
			for name, content := range map[string]string{"hello": "from the host\n", "gone": "deleted by the container\n"} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			out, err := c.Ctr("run", "--rm", "--runtime", runtimeName, "--rootfs", dir, "dirroot",
				"/bin/sh", "-c", "cat /hello; echo x > /written; rm /gone; cat /written")
			if err != nil || out != "from the host\nx\n" {
				t.Fatalf("ctr run --rootfs: %q, %v", out, err)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "written")); err != nil || string(b) != "x\n" {
				t.Errorf("the container's write is not in the host directory: %q, %v", b, err)
			}
			if _, err := os.Stat(filepath.Join(dir, "gone")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the file the container deleted is still in the host directory: %v", err)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "hello")); err != nil || string(b) != "from the host\n" {
				t.Errorf("hello = %q, %v", b, err)
			}
			c.WaitNoShim(t)
		})
	}
}
