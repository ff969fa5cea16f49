package integration

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// leakAudit fails t if anything of the sandboxes under root (a test's
// state and data directories, see shimContainerd) is left on the host
// once their shims are gone: a QEMU, a sandbox state directory, a socket,
// a loop device or mount of a container's disk, a tap device, a held
// layer-cache lock. Run it after the test removed its containers.
func leakAudit(t *testing.T, c *harness.Containerd, root string) {
	t.Helper()
	c.WaitNoShim(t)
	assertClean(t, filepath.Join(root, "run"))
	var sockets, locked []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type()&os.ModeSocket != 0 {
			sockets = append(sockets, p)
		}
		if d.Type().IsRegular() && strings.HasSuffix(p, ".lock") && !lockFree(p) {
			locked = append(locked, p)
		}
		return nil
	})
	if len(sockets) > 0 {
		t.Errorf("sockets left: %v", sockets)
	}
	if len(locked) > 0 {
		t.Errorf("layer-cache locks still held: %v", locked)
	}
	if out, _ := exec.Command("losetup", "-a").Output(); strings.Contains(string(out), root) {
		t.Errorf("loop devices left:\n%s", out)
	}
	if mounts, _ := os.ReadFile("/proc/mounts"); strings.Contains(string(mounts), root) {
		t.Errorf("mounts left under %s", root)
	}
	if out, _ := exec.Command("ip", "-o", "link", "show", "type", "tun").Output(); len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("tap devices left:\n%s", out)
	}
}

// lockFree reports whether nobody holds an flock on path.
func lockFree(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return true
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return true
}

// procUsage is a process's open file descriptors and resident memory.
type procUsage struct {
	fds    int
	rssKiB int
}

func usageOf(t *testing.T, pid int) procUsage {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatalf("fds of %d: %v", pid, err)
	}
	u := procUsage{fds: len(ents)}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			u.rssKiB, _ = strconv.Atoi(strings.Fields(v)[0])
		}
	}
	return u
}

// taskPID returns the pid `ctr task ls` shows for id: the sandbox's QEMU.
func taskPID(t *testing.T, c *harness.Containerd, id string) int {
	t.Helper()
	for _, line := range strings.Split(c.MustCtr("task", "ls"), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("task ls: %q", line)
			}
			return pid
		}
	}
	t.Fatalf("task %s not listed", id)
	return 0
}
