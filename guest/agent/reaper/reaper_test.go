package reaper

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

const helperEnv = "COCOON_REAPER_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		if err := orphanHelper(); err != nil {
			fmt.Println("FAIL:", err)
			os.Exit(1)
		}
		fmt.Println("OK")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func start(t *testing.T, r *Reaper, args ...string) *Child {
	t.Helper()
	c, err := r.Start(func() (int, error) {
		return syscall.ForkExec(args[0], args, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Setsid: true}})
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitDone(t *testing.T, c *Child) Exit {
	t.Helper()
	select {
	case <-c.Done():
		return c.Exit()
	case <-time.After(10 * time.Second):
		t.Fatalf("pid %d not reaped", c.Pid())
	}
	return Exit{}
}

func TestExitStatuses(t *testing.T) {
	r := New(Options{})
	defer r.Close()
	if e := waitDone(t, start(t, r, "/bin/sh", "-c", "exit 3")); e.Status() != 3 || e.Signal() != 0 {
		t.Fatalf("exit 3: %+v status %d", e, e.Status())
	}
	c := start(t, r, "/bin/sleep", "100")
	if err := c.Signal(unix.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	if e := waitDone(t, c); e.Status() != 137 || e.Signal() != unix.SIGKILL {
		t.Fatalf("kill: status %d signal %v", e.Status(), e.Signal())
	}
	if err := c.Signal(unix.SIGKILL, false); !errdefs.IsNotFound(err) {
		t.Fatalf("signal after exit: want not found, got %v", err)
	}
	if r.Running() != 0 {
		t.Fatalf("%d children still registered", r.Running())
	}
}

func TestFastExitBeforeRegistration(t *testing.T) {
	r := New(Options{})
	defer r.Close()
	// Children that exit before Start returns are still collected.
	for range 50 {
		waitDone(t, start(t, r, "/bin/true"))
	}
}

func TestLeavesOtherChildrenAlone(t *testing.T) {
	r := New(Options{})
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", "exit 4")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, start(t, r, "/bin/true"))
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 4 {
		t.Fatalf("exec.Cmd lost its status to the reaper: %v", err)
	}
}

// TestOrphans runs as a child subreaper in a subprocess, so that orphans
// are reparented to it as they are to PID 1.
func TestOrphans(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("helper: %v\n%s", err, out)
	}
}

func orphanHelper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
	}
	r := New(Options{Orphans: true})
	defer r.Close()
	var children []*Child
	for i := range 10 {
		c, err := r.Start(func() (int, error) {
			// The shell exits at once; its background sleep is orphaned
			// to us and must be reaped silently.
			return syscall.ForkExec("/bin/sh", []string{"sh", "-c", fmt.Sprintf("sleep 0.1 & exit %d", i)}, &syscall.ProcAttr{})
		})
		if err != nil {
			return err
		}
		children = append(children, c)
	}
	for i, c := range children {
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			return fmt.Errorf("child %d not reaped", i)
		}
		if e := c.Exit(); e.Lost || e.Status() != uint32(i) {
			return fmt.Errorf("child %d: %+v status %d", i, e, e.Status())
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := childCount()
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d children (orphans or zombies) left", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// childCount counts processes whose parent is this one.
func childCount() (int, error) {
	self := strconv.Itoa(os.Getpid())
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		rest := s[strings.LastIndexByte(s, ')')+2:]
		f := strings.Fields(rest)
		if len(f) > 1 && f[1] == self {
			n++
		}
	}
	return n, nil
}
