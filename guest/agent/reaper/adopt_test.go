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

const adoptHelperEnv = "COCOON_REAPER_ADOPT_HELPER"

// TestAdopt runs as a child subreaper collecting orphans, as PID 1 does,
// in a subprocess: grandchildren are reparented to it.
func TestAdopt(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestAdoptHelper$", "-test.v")
	cmd.Env = append(os.Environ(), adoptHelperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ADOPT OK") {
		t.Fatalf("helper: %v\n%s", err, out)
	}
}

func TestAdoptHelper(t *testing.T) {
	if os.Getenv(adoptHelperEnv) != "1" {
		t.Skip("runs in TestAdopt's subprocess")
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	r := New(Options{Orphans: true})
	defer r.Close()
	dir := t.TempDir()

	// spawn runs a shell that leaves script running in the background and
	// exits; it returns the background process's pid once the shell is
	// gone, as runc create does with the container's init.
	spawn := func(name, script string) int {
		t.Helper()
		pidFile := filepath.Join(dir, name)
		sh, err := r.Start(func() (int, error) {
			return syscall.ForkExec("/bin/sh", []string{"sh", "-c", fmt.Sprintf("(%s) & echo $! >%s", script, pidFile)}, &syscall.ProcAttr{})
		})
		if err != nil {
			t.Fatal(err)
		}
		if e := waitDone(t, sh); e.Status() != 0 {
			t.Fatalf("parent shell: status %d", e.Status())
		}
		b, err := os.ReadFile(pidFile)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}

	// Exits before it is adopted: the status is kept for Adopt.
	a := r.Expect()
	early := spawn("early", "sleep 0.2; exit 7")
	time.Sleep(600 * time.Millisecond)
	c, err := a.Adopt(early)
	if err != nil {
		t.Fatal(err)
	}
	if e := waitDone(t, c); e.Lost || e.Status() != 7 {
		t.Fatalf("early exit: %+v status %d", e, e.Status())
	}
	a.Done()
	a.Done()

	// Exits after it is adopted.
	a = r.Expect()
	late := spawn("late", "sleep 0.3; exit 5")
	c, err = a.Adopt(late)
	if err != nil {
		t.Fatal(err)
	}
	a.Done()
	if e := waitDone(t, c); e.Lost || e.Status() != 5 {
		t.Fatalf("late exit: %+v status %d", e, e.Status())
	}

	// Not a child of ours: refused with a reason.
	a = r.Expect()
	defer a.Done()
	if _, err := a.Adopt(os.Getppid()); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("adopting a non-child: want failed precondition, got %v", err)
	}
	if _, err := a.Adopt(0); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("adopting pid 0: want invalid argument, got %v", err)
	}
	fmt.Println("ADOPT OK")
}

func TestEarlyBounded(t *testing.T) {
	r := &Reaper{}
	for pid := 1; pid <= maxEarly+10; pid++ {
		r.keepEarlyLocked(pid, Exit{})
	}
	if len(r.early) != maxEarly || len(r.earlyOrder) != maxEarly {
		t.Fatalf("kept %d (%d ordered), want %d", len(r.early), len(r.earlyOrder), maxEarly)
	}
	if _, ok := r.early[1]; ok {
		t.Fatal("oldest exit kept")
	}
	if _, ok := r.early[maxEarly+10]; !ok {
		t.Fatal("newest exit dropped")
	}
}
