package network

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/reexec"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// holderName is the argv[0] a holder is re-executed under, which
// reexec.Init dispatches on; it is also the holder's command line in ps.
const holderName = "cocoon-netns-holder"

const (
	// holderReadyTimeout bounds the wait for a new holder's ready byte;
	// a binary whose main does not call reexec.Init never sends it.
	holderReadyTimeout = 10 * time.Second
	// holderExitTimeout is how long Close lets a holder end by itself
	// once its stdin is closed before it kills it.
	holderExitTimeout = 2 * time.Second
)

// nsGetNSType is NS_GET_NSTYPE, _IO(0xb7, 0x3), which golang.org/x/sys
// does not define: the CLONE_NEW* type of a namespace file.
const nsGetNSType = 0xb703

func init() { reexec.Register(holderName, holderMain) }

// holderMain is the holder process. It writes one byte on stdout to
// say it runs as a holder, then reads stdin, a pipe from its parent,
// until EOF: it ends when its parent closes the pipe or dies. It opens
// nothing, and keeps the default signal dispositions, so SIGTERM and
// SIGKILL end it too.
func holderMain() {
	if _, err := os.Stdout.Write([]byte{0}); err != nil {
		os.Exit(1)
	}
	os.Stdout.Close()
	if _, err := io.Copy(io.Discard, os.Stdin); err != nil {
		os.Exit(1)
	}
}

// Holder is a process that lives in a network namespace on the host, so
// that OCI hooks find the namespace from its pid.
//
// nerdctl's createRuntime hook (which runs CNI) and Docker's prestart
// hook look for the container's network namespace at /proc/<pid>/ns/net
// of the OCI state's pid. With runc that is the container's init; a VM
// boots after the hooks ran (its NICs mirror the veth CNI made), so the
// shim gives them a holder's pid instead, as Kubernetes does with pause.
// The holder is this binary re-executed (reexec), so every binary that
// makes one must start its main with reexec.Init.
type Holder struct {
	// path is the namespace's path: the bind mount NewNamespace made,
	// or the path Join was given.
	path string
	// owned is whether path is the file NewNamespace made, which Close
	// unmounts and removes.
	owned bool
	// cmd is the holder process. Only Close waits for it, so its pid
	// cannot be reused before then.
	cmd *exec.Cmd
	// stdin is the write end of the holder's stdin; closing it ends
	// the holder.
	stdin *os.File

	// closeOnce makes Close run once; closeErr is what it returned.
	closeOnce sync.Once
	closeErr  error
}

// NewNamespace makes a network namespace, held by a new holder,
// bind-mounted at path (which must not exist), with its loopback up as
// runc brings it up. The mount gives the namespace a stable path, for an
// annotation and for Plumb; Close removes it, and RemoveNamespaceFile
// does after a crash of this process. On error nothing is left.
func NewNamespace(path string) (_ *Holder, retErr error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("network namespace %s: %w: %w", path, err, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	f.Close()
	h, err := startHolder(unix.CLONE_NEWNET, func(start func() error) error { return start() })
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	h.path, h.owned = path, true
	defer func() {
		if retErr != nil {
			h.Close()
		}
	}()
	// The holder is not waited for yet, so the pid is still its own.
	src := fmt.Sprintf("/proc/%d/ns/net", h.PID())
	if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("network namespace %s: bind-mount %s: %w", path, src, err)
	}
	// In the parent rather than in the holder, which is to stay minimal.
	if err := setLoopbackUp(path); err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	return h, nil
}

// Join starts a holder in the existing network namespace at nsPath. The
// namespace is left as it is, and Close leaves it.
func Join(nsPath string) (_ *Holder, retErr error) {
	ns, err := openNetNamespace(nsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	// A child starts in the network namespace of the thread that forks
	// it.
	h, err := startHolder(0, func(start func() error) error {
		return onNamespaceThread(func() error { return netns.Set(ns) }, start)
	})
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", nsPath, err)
	}
	h.path = nsPath
	defer func() {
		if retErr != nil {
			h.Close()
		}
	}()
	var want, got unix.Stat_t
	if err := unix.Fstat(int(ns), &want); err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", nsPath, err)
	}
	src := fmt.Sprintf("/proc/%d/ns/net", h.PID())
	if err := unix.Stat(src, &got); err != nil {
		return nil, fmt.Errorf("network namespace %s: holder: %w", nsPath, err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		return nil, fmt.Errorf("network namespace %s: the holder (pid %d) is in another network namespace: %w", nsPath, h.PID(), errdefs.ErrInternal)
	}
	return h, nil
}

// PID is the holder's pid, for the OCI state that hooks read.
func (h *Holder) PID() int { return h.cmd.Process.Pid }

// Path is the namespace's path: the bind mount NewNamespace made, or
// the path Join was given.
func (h *Holder) Path() string { return h.path }

// Close ends the holder: it closes the holder's stdin, waits briefly for
// it to exit, then kills it. For NewNamespace it then unmounts (lazily:
// a tap or an open handle may keep the namespace alive a while) and
// removes the file. Safe to call more than once, and after the holder
// died; it returns the first call's result.
func (h *Holder) Close() error {
	h.closeOnce.Do(func() {
		h.stdin.Close()
		kill := time.AfterFunc(holderExitTimeout, func() { h.cmd.Process.Kill() })
		// How the holder ended is no matter: the namespace outlives it.
		h.cmd.Wait()
		kill.Stop()
		if h.owned {
			h.closeErr = RemoveNamespaceFile(h.path)
		}
	})
	return h.closeErr
}

// RemoveNamespaceFile undoes what a crashed process left at path: it
// unmounts it if it is a mount point and removes it. Nothing at path is
// not an error. For cleanup of a stale sandbox's state.
func RemoveNamespaceFile(path string) error {
	for {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if err == nil {
			continue // a mount under it, if any, goes next
		}
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if errors.Is(err, unix.EINVAL) { // not a mount point
			break
		}
		return fmt.Errorf("network namespace %s: unmount: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	return nil
}

// startHolder starts a holder, with cloneflags, through spawn, which
// calls start on the thread the holder is to take its namespaces from.
// It returns once the holder said it runs; no pipe end but the holder's
// stdin is left open in this process.
func startHolder(cloneflags uintptr, spawn func(start func() error) error) (*Holder, error) {
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("holder: %w", err)
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdinW.Close()
		return nil, fmt.Errorf("holder: %w", err)
	}
	defer readyR.Close()
	cmd := &exec.Cmd{
		Path:   reexec.Self(),
		Args:   []string{holderName},
		Dir:    "/", // pin no directory, nor the mount it is on
		Stdin:  stdinR,
		Stdout: readyW,
		Stderr: os.Stderr,
		// No Pdeathsig: it fires when the forking thread ends, not this
		// process; the stdin pipe ties the holder to the process. Its own
		// process group keeps a terminal's ^C to its parent.
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: cloneflags, Setpgid: true},
	}
	err = spawn(cmd.Start)
	stdinR.Close()
	readyW.Close()
	if err != nil {
		stdinW.Close()
		return nil, fmt.Errorf("start a holder: %w", err)
	}
	h := &Holder{cmd: cmd, stdin: stdinW}
	readyR.SetReadDeadline(time.Now().Add(holderReadyTimeout))
	if _, err := io.ReadFull(readyR, make([]byte, 1)); err != nil {
		h.Close()
		return nil, fmt.Errorf("the holder (pid %d) did not start as one (does the binary's main call reexec.Init first?): %w", cmd.Process.Pid, err)
	}
	return h, nil
}

// openNetNamespace opens the network namespace at path, saying what is
// wrong with a path that is not one.
func openNetNamespace(path string) (netns.NsHandle, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return netns.None(), fmt.Errorf("network namespace %s: %w: %w", path, err, errdefs.ErrNotFound)
		}
		return netns.None(), fmt.Errorf("network namespace %s: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		unix.Close(fd)
		return netns.None(), fmt.Errorf("network namespace %s: %w", path, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		unix.Close(fd)
		return netns.None(), fmt.Errorf("%s is not a namespace: %w", path, errdefs.ErrInvalidArgument)
	}
	// A kernel without NS_GET_NSTYPE (before 4.11) leaves it to setns.
	if t, err := unix.IoctlRetInt(fd, nsGetNSType); err == nil && t != unix.CLONE_NEWNET {
		unix.Close(fd)
		return netns.None(), fmt.Errorf("%s is not a network namespace: %w", path, errdefs.ErrInvalidArgument)
	}
	return netns.NsHandle(fd), nil
}

// setLoopbackUp brings lo up in the network namespace at path.
func setLoopbackUp(path string) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo: up: %w", err)
	}
	return nil
}

// InNamespace runs fn on an OS thread that has entered the network
// namespace at path, and returns its error. A process fn starts is in
// that namespace (a child takes its namespaces from the thread that
// forks it).
func InNamespace(path string, fn func() error) error {
	ns, err := openNetNamespace(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	return onNamespaceThread(func() error { return netns.Set(ns) }, fn)
}
