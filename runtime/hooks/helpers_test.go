package hooks

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The tests run one after another, never in parallel: a script written
// while another test forks could be held open for writing by the child
// and fail to exec with ETXTBSY.

// script writes an executable /bin/sh script of body into dir and returns
// its path. Scripts name every program by its absolute path: a hook's
// environment has no PATH unless its Env gives one.
func script(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// testState is a container's state as a shim would pass it to a hook.
func testState(bundle string) specs.State {
	return specs.State{
		Version:     specs.Version,
		ID:          "c1",
		Status:      specs.StateCreating,
		Pid:         4242,
		Bundle:      bundle,
		Annotations: map[string]string{"io.example/a": "b"},
	}
}

// seconds returns a hook timeout of n seconds.
func seconds(n int) *int { return &n }

// readFile returns the content of path, failing the test if it cannot.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// exists says whether path exists.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// readPid reads the pid a hook wrote to path.
func readPid(t *testing.T, path string) int {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, path)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitGone waits up to 5s for the process of pid to be gone (or a zombie
// whose reaper is not this test), failing the test if it lives on.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		// The state follows the command's closing parenthesis.
		if s := string(stat); strings.HasPrefix(s[strings.LastIndexByte(s, ')')+1:], " Z") {
			return
		}
	}
	_ = unix.Kill(pid, unix.SIGKILL)
	t.Fatalf("process %d outlived its hook", pid)
}

// waitChild waits up to 5s for a child of this process running comm and
// returns its pid.
func waitChild(t *testing.T, comm string) int {
	t.Helper()
	self := strconv.Itoa(os.Getpid())
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			// pid (comm) state ppid ...
			s := string(stat)
			open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
			if open < 0 || end < open {
				continue
			}
			rest := strings.Fields(s[end+1:])
			if s[open+1:end] == comm && len(rest) > 1 && rest[1] == self {
				pid, _ := strconv.Atoi(e.Name())
				return pid
			}
		}
	}
	t.Fatalf("no child %s started", comm)
	return 0
}

// inheritable returns this process's descriptors that lack close-on-exec.
func inheritable(t *testing.T) map[int]bool {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	fds := map[int]bool{}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			fds[fd] = true
		}
	}
	return fds
}
