package hostcgroup

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/reexec"
)

// The tests make cgroups below a parent of their own at the root of every
// hierarchy (/cocoon-test-<random>), which they remove, and move only
// processes they start into them: never the test binary, whose runner
// would be accounted with them.

// helperName is the argv[0] under which the test binary runs as a
// helper: a process that calls the package's exported API on itself, at
// the commands it reads on stdin.
const helperName = "cocoon-hostcgroup-helper"

func init() { reexec.Register(helperName, helperMain) }

func TestMain(m *testing.M) {
	if reexec.Init() {
		return
	}
	os.Exit(m.Run())
}

// helperMain runs the helper. Each line of stdin is a command and each
// gets one line in answer, "ok" and what it returns, or "err <class>:
// <message>":
//
//	join <cgroupsPath> <memory> <quota> <period> <shares> <pids>
//	update <memory> <quota> <period> <shares> <pids>
//	leave
//	alloc <MiB>     touch that much more memory and keep it
//	spawn           start a sleep (in whatever cgroup the helper is in); ok <pid>
func helperMain() {
	var g *Group
	var kept [][]byte
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		var err error
		var out string
		switch f[0] {
		case "join":
			g, err = Join(f[1], parseLimits(f[2:]))
		case "update":
			err = g.Update(parseLimits(f[1:]))
		case "leave":
			err = g.Leave()
		case "alloc":
			n, _ := strconv.Atoi(f[1])
			b := make([]byte, n<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			kept = append(kept, b)
		case "spawn":
			cmd := exec.Command("sleep", "1000")
			if err = cmd.Start(); err == nil {
				go cmd.Wait()
				out = strconv.Itoa(cmd.Process.Pid)
			}
		}
		if err != nil {
			fmt.Printf("err %s: %s\n", class(err), strings.ReplaceAll(err.Error(), "\n", "; "))
		} else {
			fmt.Printf("ok %s\n", out)
		}
	}
}

// class is the errdefs class of err, as the helper reports it.
func class(err error) string {
	switch {
	case errdefs.IsFailedPrecondition(err):
		return "failed-precondition"
	case errdefs.IsAlreadyExists(err):
		return "already-exists"
	case errdefs.IsInvalidArgument(err):
		return "invalid-argument"
	}
	return "other"
}

// parseLimits reads the helper's five limit fields.
func parseLimits(f []string) Limits {
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	return Limits{MemoryBytes: n(0), CPUQuota: n(1), CPUPeriod: uint64(n(2)), CPUShares: uint64(n(3)), Pids: n(4)}
}

// limitArgs writes l as the helper's five limit fields.
func limitArgs(l Limits) string {
	return fmt.Sprintf("%d %d %d %d %d", l.MemoryBytes, l.CPUQuota, l.CPUPeriod, l.CPUShares, l.Pids)
}

// helper is a running helper process.
type helper struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startHelper starts a helper, which the test's cleanup ends.
func startHelper(t *testing.T) *helper {
	t.Helper()
	cmd := &exec.Cmd{Path: reexec.Self(), Args: []string{helperName}, Stderr: os.Stderr}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return h
}

// do sends the helper a command and returns its answer.
func (h *helper) do(t *testing.T, format string, args ...any) string {
	t.Helper()
	if _, err := fmt.Fprintf(h.in, format+"\n", args...); err != nil {
		t.Fatal(err)
	}
	if !h.out.Scan() {
		t.Fatalf("the helper ended: %v", h.out.Err())
	}
	return h.out.Text()
}

// ok sends the helper a command that must succeed and returns what it
// returned.
func (h *helper) ok(t *testing.T, format string, args ...any) string {
	t.Helper()
	got := h.do(t, format, args...)
	if !strings.HasPrefix(got, "ok") {
		t.Fatalf("%s: %s", fmt.Sprintf(format, args...), got)
	}
	return strings.TrimSpace(strings.TrimPrefix(got, "ok"))
}

// needHost skips the test unless it runs as root on a host whose
// hierarchies carry the memory, cpu and pids controllers, and returns
// the host's layout.
func needHost(t *testing.T) layout {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes cgroups and moves processes into them")
	}
	lay, err := hostLayout()
	if err != nil {
		t.Skip(err)
	}
	var absent []string
	if lay.v1 {
		subs, err := cgroup1.Default()
		if err != nil {
			t.Skipf("no cgroup v1 hierarchies: %v", err)
		}
		for _, want := range []cgroup1.Name{cgroup1.Memory, cgroup1.Cpu, cgroup1.Pids} {
			found := false
			for _, s := range subs {
				found = found || s.Name() == want
			}
			if !found {
				absent = append(absent, "the v1 "+string(want)+" hierarchy")
			}
		}
	} else {
		b, err := os.ReadFile(filepath.Join(lay.unified, "cgroup.controllers"))
		if err != nil {
			t.Skip(err)
		}
		for _, c := range v2Controllers {
			if !slices.Contains(strings.Fields(string(b)), c) {
				absent = append(absent, "the v2 "+c+" controller")
			}
		}
	}
	if len(absent) > 0 {
		t.Skipf("this host has not %s", strings.Join(absent, ", "))
	}
	return lay
}

// testParent returns a parent for the test's cgroups, below the root of
// every hierarchy, which the test's cleanup removes with what is in it.
func testParent(t *testing.T, lay layout) string {
	t.Helper()
	return testParentNamed(t, lay, "/cocoon-test-%s")
}

// testParentNamed is testParent with the name format, which %s in it
// makes unique.
func testParentNamed(t *testing.T, lay layout, format string) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	parent := fmt.Sprintf(format, hex.EncodeToString(b))
	t.Cleanup(func() {
		hs, _, err := lay.hierarchies(parent, 0)
		if err != nil {
			t.Error(err)
			return
		}
		for _, h := range hs {
			// Leaves first: a cgroup directory goes with rmdir alone.
			var dirs []string
			filepath.WalkDir(h.dir, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				if err := syscall.Rmdir(dirs[i]); err != nil {
					t.Errorf("clean up %s: %v", dirs[i], err)
				}
			}
		}
	})
	return parent
}

// sleeper starts a process, a sleep, that the test's cleanup kills.
func sleeper(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd.Process.Pid
}

// cgroupOf returns the lines of /proc/<pid>/cgroup, and checks that
// every thread of the process is where the process is.
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		tb, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/cgroup", pid, task.Name()))
		if err == nil && string(tb) != string(b) {
			t.Errorf("thread %s of process %d is in\n%s\nthe process in\n%s", task.Name(), pid, tb, b)
		}
	}
	return string(b)
}

// inGroup checks that the process pid is in the cgroup at p in every
// hierarchy of lay.
func inGroup(t *testing.T, lay layout, pid int, p string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(cgroupOf(t, pid)), "\n")
	for _, line := range lines {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && (lay.v1 || f[0] == "0") && f[2] != p {
			t.Errorf("process %d is in %s, not in %s", pid, line, p)
		}
	}
}

// gone checks that the cgroup at p exists in no hierarchy of lay.
func gone(t *testing.T, lay layout, p string) {
	t.Helper()
	hs, _, err := lay.hierarchies(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if _, err := os.Lstat(h.dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there (%v)", h.dir, err)
		}
	}
}

// waitGone waits for the process pid to be gone from the cgroup at dir.
func waitGone(t *testing.T, dir string, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		pids, err := procs(dir)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range pids {
			found = found || p == pid
		}
		if !found {
			return
		}
	}
	t.Fatalf("process %d is still in %s", pid, dir)
}
