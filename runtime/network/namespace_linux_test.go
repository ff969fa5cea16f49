package network

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"github.com/moby/sys/reexec"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestMain runs the holder when the test binary is re-executed as one,
// and fails the run if a test left a holder behind.
func TestMain(m *testing.M) {
	if reexec.Init() {
		return
	}
	code := m.Run()
	if pids := holderChildren(); len(pids) > 0 {
		fmt.Fprintf(os.Stderr, "holders left running: %v\n", pids)
		code = 1
	}
	os.Exit(code)
}

// holderChildren are the pids of this process's children that run as
// holders, zombies included.
func holderChildren() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		// stat is "pid (comm) state ppid ..."; comm may hold spaces.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 || string(cmdline) != holderName+"\x00" {
			continue
		}
		if f := strings.Fields(string(stat[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(os.Getpid()) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// nsPathForTest is a path for a namespace file, which the test checks
// is no mount point when it ends.
func nsPathForTest(t *testing.T) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("network namespaces need root")
	}
	path := filepath.Join(t.TempDir(), "netns")
	t.Cleanup(func() {
		if mounted(t, path) {
			t.Errorf("%s is still mounted", path)
			unix.Unmount(path, unix.MNT_DETACH)
		}
	})
	return path
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		t.Fatal(err)
	}
	return len(ms) > 0
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// gone reports whether pid no longer exists, not even as a zombie.
func gone(pid int) bool { return errors.Is(unix.Kill(pid, 0), unix.ESRCH) }

func TestNewNamespace(t *testing.T) {
	path := nsPathForTest(t)
	h, err := NewNamespace(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if h.Path() != path {
		t.Errorf("Path() = %s, want %s", h.Path(), path)
	}
	if fmt.Sprint(holderChildren()) != fmt.Sprint([]int{h.PID()}) {
		t.Errorf("holders %v, want [%d]", holderChildren(), h.PID())
	}
	holderNS := fmt.Sprintf("/proc/%d/ns/net", h.PID())
	if !sameFile(t, path, holderNS) {
		t.Errorf("%s is not the holder's namespace", path)
	}
	if sameFile(t, path, "/proc/self/ns/net") {
		t.Errorf("%s is the host's namespace", path)
	}
	if !mounted(t, path) {
		t.Errorf("%s is no mount point", path)
	}

	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	if lo, err := nh.LinkByName("lo"); err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("lo is not up: %v", err)
	}

	// A veth moved in, as CNI would, is what Plumb finds there.
	host := fmt.Sprintf("ccnh%d", os.Getpid()%100000)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	defer netlink.LinkDel(veth)
	p, err := Plumb(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Config.Interfaces) != 1 || p.Config.Interfaces[0].Name != "eth0" {
		t.Errorf("Plumb found %+v, want eth0", p.Config.Interfaces)
	}
	if err := p.Close(); err != nil {
		t.Error(err)
	}

	pid := h.PID()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if !gone(pid) {
		t.Errorf("holder %d outlived Close", pid)
	}
	if mounted(t, path) {
		t.Errorf("%s is mounted after Close", path)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after Close: %v", path, err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

func TestNewNamespaceExists(t *testing.T) {
	path := nsPathForTest(t)
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if h, err := NewNamespace(path); !errors.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), path) {
		if h != nil {
			h.Close()
		}
		t.Fatalf("err = %v, want already exists naming %s", err, path)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the file that was there: %v", err)
	}
}

func TestJoin(t *testing.T) {
	path, _ := testNetns(t)
	h, err := Join(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if h.Path() != path {
		t.Errorf("Path() = %s, want %s", h.Path(), path)
	}
	if !sameFile(t, path, fmt.Sprintf("/proc/%d/ns/net", h.PID())) {
		t.Errorf("the holder is not in %s", path)
	}
	pid := h.PID()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if !gone(pid) {
		t.Errorf("holder %d outlived Close", pid)
	}
	// The namespace is its owner's: still there.
	if _, err := openNetNamespace(path); err != nil {
		t.Errorf("after Close: %v", err)
	}
}

func TestJoinNotANetworkNamespace(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("network namespaces need root")
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]error{
		file:                      errdefs.ErrInvalidArgument,
		"/proc/self/ns/mnt":       errdefs.ErrInvalidArgument,
		file + ".no-such-thing":   errdefs.ErrNotFound,
		"/var/run/netns/cocoon-x": errdefs.ErrNotFound,
	} {
		h, err := Join(path)
		if h != nil {
			h.Close()
		}
		if !errors.Is(err, want) || !strings.Contains(err.Error(), path) {
			t.Errorf("Join(%s): %v, want %v naming the path", path, err, want)
		}
	}
}

// A bind mount whose holder was killed, as after a crash, is cleaned up.
func TestRemoveNamespaceFileStale(t *testing.T) {
	path := nsPathForTest(t)
	h, err := NewNamespace(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.cmd.Wait()
	h.stdin.Close()
	// The mount holds the namespace without its holder.
	if ns, err := openNetNamespace(path); err != nil {
		t.Fatalf("the stale mount: %v", err)
	} else {
		ns.Close()
	}
	if err := RemoveNamespaceFile(path); err != nil {
		t.Fatal(err)
	}
	if mounted(t, path) {
		t.Errorf("%s is still mounted", path)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: %v", path, err)
	}
	// Nothing there, or a plain file, is fine too.
	if err := RemoveNamespaceFile(path); err != nil {
		t.Errorf("nothing there: %v", err)
	}
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := RemoveNamespaceFile(path); err != nil {
		t.Errorf("a plain file: %v", err)
	}
}

// The holder ends by itself, exiting 0, once its parent's end of the
// pipe is closed, as when the parent dies.
func TestHolderEndsWithPipe(t *testing.T) {
	path := nsPathForTest(t)
	h, err := NewNamespace(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- h.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the holder ended with %v, want exit 0", err)
		}
	case <-time.After(holderExitTimeout):
		h.cmd.Process.Kill()
		<-done
		t.Error("the holder outlived its pipe")
	}
}
