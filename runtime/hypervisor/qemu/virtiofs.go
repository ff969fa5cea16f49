package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

// DefaultVirtiofsd is the file server of Spec.Share: Debian's virtiofsd,
// the C implementation of QEMU 7.2 (package qemu-system-common).
const DefaultVirtiofsd = "/usr/lib/qemu/virtiofsd"

// Names of the share's files in Spec.StateDir.
const (
	// VirtiofsSocketName is the vhost-user socket between QEMU and
	// virtiofsd.
	VirtiofsSocketName = "virtiofs.sock"
	// VirtiofsdPIDFileName holds virtiofsd's pid, for Cleanup.
	VirtiofsdPIDFileName = "virtiofsd.pid"
	// VirtiofsdLogName is virtiofsd's stderr, capped at
	// virtiofsdLogBytes. Like console.log it outlives the VM.
	VirtiofsdLogName = "virtiofsd.log"
)

const (
	// shareChardevID is QEMU's id of the vhost-user socket.
	shareChardevID = "fs0"
	// shareQueueSize is the request queue's size, QEMU's largest: the
	// guest's FUSE requests wait in it rather than in the guest.
	shareQueueSize = 1024
	// virtiofsdFD is the listening socket's descriptor in virtiofsd.
	virtiofsdFD = 3
	// virtiofsdLogBytes caps virtiofsd.log: the daemon says a few lines
	// when it starts and stops, and its errors.
	virtiofsdLogBytes = 256 << 10
	// virtiofsdStateEnv is the one variable of virtiofsd's environment:
	// the state dir it serves, which Cleanup looks for in
	// /proc/<pid>/environ to recognize it (its command line names only
	// the shared directory).
	virtiofsdStateEnv = "COCOON_STATE_DIR"
)

// How long virtiofsd gets to end. Once QEMU is gone the daemon ends by
// itself when it sees the vhost-user connection close (within
// milliseconds); then SIGTERM, then SIGKILL. With a deadline on the
// context the first two get shares of what is left (see endVirtiofsd).
const (
	virtiofsdExitWait = time.Second
	virtiofsdTermWait = 2 * time.Second
	virtiofsdKillWait = 5 * time.Second
	// virtiofsdFailWait bounds how long a failed launch waits to learn
	// whether virtiofsd failed first, which would be the reason.
	virtiofsdFailWait = 200 * time.Millisecond
)

// shareTagPattern is the form of Share.Tag: virtio-fs holds at most 36
// bytes, and QEMU's option syntax and the guest's mount take these
// without quoting.
var shareTagPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,36}$`)

// validateShare checks spec's share, if it has one: a tag, a directory,
// and a guest whose RAM the daemon can map.
func validateShare(s hypervisor.Spec) error {
	sh := s.Share
	if sh == nil {
		return nil
	}
	if !shareTagPattern.MatchString(sh.Tag) {
		return fmt.Errorf("%w: share tag %q: want 1-36 characters of [A-Za-z0-9._-]", errdefs.ErrInvalidArgument, sh.Tag)
	}
	if !filepath.IsAbs(sh.Dir) {
		return fmt.Errorf("%w: shared directory %q is not an absolute path", errdefs.ErrInvalidArgument, sh.Dir)
	}
	if fi, err := os.Stat(sh.Dir); err != nil {
		return fmt.Errorf("%w: shared directory: %w", errdefs.ErrInvalidArgument, err)
	} else if !fi.IsDir() {
		return fmt.Errorf("%w: shared directory %s is not a directory", errdefs.ErrInvalidArgument, sh.Dir)
	}
	// A clone maps its template's RAM privately, which virtiofsd
	// cannot map; and a template's state, saved with a share, could
	// not be saved anyway (see Save).
	if s.Memory != nil && !s.Memory.Shared {
		return fmt.Errorf("%w: a vm whose memory is a private file mapping (a template's clone) cannot share host directories: templates with shares are not supported yet", errdefs.ErrNotImplemented)
	}
	if s.Restore != nil {
		return fmt.Errorf("%w: a restored vm cannot share host directories: QEMU cannot save or load the state of a virtio-fs device", errdefs.ErrNotImplemented)
	}
	return nil
}

// virtiofsdArgs are virtiofsd's arguments (without argv[0]) for sh, its
// vhost-user socket listening on descriptor virtiofsdFD.
//
// The socket is made and bound by the driver and handed over, not named
// with --socket-path: virtiofsd would bind it by its full path, which may
// not fit a sockaddr_un (see qmpChardev), and for a path it also writes a
// lock file of its own under /run/virtiofsd that it never removes.
//
//	sandbox=namespace   the daemon serves from new mount, pid and net
//	                    namespaces, pivoted into sh.Dir; the host's mounts
//	                    are its slaves, so later mounts under a shared
//	                    sh.Dir reach it
//	cache=auto          the guest caches attributes and names for 1 s
//	                    and file data until a file changes on open
//	announce_submounts  each mount under sh.Dir is a mount of its own in
//	                    the guest: without it every file of every host
//	                    mount has the share's device number, and inode
//	                    numbers of two host filesystems collide (two bind
//	                    mounts of tmpfs dirs: both roots inode 1 on one
//	                    device; du counted only one of them)
//	no_posix_lock       POSIX locks stay in the guest kernel, the only
//	                    client; the daemon's remote locks would block its
//	                    request thread on a F_SETLKW
//	no_flock            flock(2) likewise
//	no_xattr            no extended attributes: a guest could otherwise
//	                    set security.* and trusted.* ones on host files
//	modcaps=-mknod      no device nodes: the guest kernel is not trusted
//	                    to keep to the container's capabilities, and a
//	                    device node it made in a read-write bind would be
//	                    a device node on the host (FIFOs need no
//	                    capability and still work)
//	thread-pool-size=0  requests run on the queue's thread: one request
//	                    queue, and no hand-off to workers to pay for
func virtiofsdArgs(sh hypervisor.Share) []string {
	return []string{
		"--fd=" + strconv.Itoa(virtiofsdFD),
		"-o", "source=" + sh.Dir,
		"-o", "sandbox=namespace",
		"-o", "cache=auto",
		"-o", "announce_submounts",
		"-o", "no_posix_lock",
		"-o", "no_flock",
		"-o", "no_xattr",
		"-o", "modcaps=-mknod",
		"--thread-pool-size=0",
	}
}

// shareArgs are QEMU's arguments for sh: the vhost-user socket, by name
// in the state dir (QEMU's working directory), and the virtio-mmio
// vhost-user-fs device on it.
func shareArgs(sh hypervisor.Share) []string {
	return []string{
		"-chardev", "socket,id=" + shareChardevID + ",path=" + VirtiofsSocketName,
		"-device", fmt.Sprintf("vhost-user-fs-device,chardev=%s,tag=%s,queue-size=%d", shareChardevID, sh.Tag, shareQueueSize),
	}
}

// listenUnixIn makes a listening unix socket named name in dir, whatever
// the length of dir's path: it binds through the directory opened O_PATH
// (/proc/self/fd/<fd>/<name>), as channel.DialUnix dials.
func listenUnixIn(dir, name string) (*os.File, error) {
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("unix socket: %w", err)
	}
	addr := &unix.SockaddrUnix{Name: "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + name}
	if err := unix.Bind(fd, addr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind %s: %w", filepath.Join(dir, name), err)
	}
	// One connection ever: QEMU's.
	if err := unix.Listen(fd, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen on %s: %w", filepath.Join(dir, name), err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir, name)), nil
}

// virtiofsd is the file server of one VM's share. With sandbox=namespace
// it is two processes: the one started, which waits, and the worker it
// forks into the new namespaces once QEMU has connected, which serves;
// the worker ends when QEMU's connection closes, and the first reaps it
// and exits with its status.
type virtiofsd struct {
	cmd      *exec.Cmd
	stateDir string
	log      *log.Entry
	// pidfd refers to the process started, for endVirtiofsd.
	pidfd int
	// stderr is the tail of its stderr, for errors.
	stderr *ring
	// exited is closed once it has exited and been reaped; waitErr is
	// cmd.Wait's result, valid from then on.
	exited  chan struct{}
	waitErr error
	// ioDone is closed once its stderr reached EOF.
	ioDone chan struct{}
	// stopping is set when the driver ends it, so that the exit is not
	// reported as a failure.
	stopping atomic.Bool
}

// startVirtiofsd starts virtiofsd (the executable bin) for spec.Share,
// listening on VirtiofsSocketName in the state dir. It returns once the
// daemon runs; QEMU's connection queues on the socket until the daemon
// takes it. On error nothing is left running and the files it made are
// removed.
func startVirtiofsd(lg *log.Entry, bin string, spec hypervisor.Spec) (_ *virtiofsd, retErr error) {
	sock, err := listenUnixIn(spec.StateDir, VirtiofsSocketName)
	if err != nil {
		return nil, fmt.Errorf("virtio-fs socket: %w", err)
	}
	// virtiofsd holds its own copy once started. Ours must not stay
	// open: were the daemon to die, QEMU's connection would wait in the
	// backlog for ever instead of being refused.
	defer sock.Close()
	made := []string{filepath.Join(spec.StateDir, VirtiofsSocketName)}
	defer func() {
		if retErr != nil {
			removeFiles(lg, made...)
		}
	}()
	logPath := filepath.Join(spec.StateDir, VirtiofsdLogName)
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create virtiofsd log: %w", err)
	}
	made = append(made, logPath)
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return nil, fmt.Errorf("virtiofsd stderr pipe: %w", err)
	}

	cmd := exec.Command(bin, virtiofsdArgs(*spec.Share)...)
	cmd.ExtraFiles = []*os.File{sock} // virtiofsdFD
	cmd.Stderr = stderrW
	cmd.Env = []string{virtiofsdStateEnv + "=" + spec.StateDir}
	// Nothing relative: the daemon keeps no hold on the shim's working
	// directory.
	cmd.Dir = "/"
	// Its own process group, as QEMU's; and, like QEMU, it outlives a
	// crashed shim, for Cleanup to end.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	stderrW.Close()
	if err != nil {
		logFile.Close()
		stderrR.Close()
		return nil, fmt.Errorf("start virtiofsd: %w", err)
	}
	f := &virtiofsd{
		cmd:      cmd,
		stateDir: spec.StateDir,
		log:      lg.WithField("virtiofsd_pid", cmd.Process.Pid),
		pidfd:    -1,
		stderr:   newRing(stderrRingBytes),
		exited:   make(chan struct{}),
		ioDone:   make(chan struct{}),
	}
	go func() {
		pumpConsole(stderrR, f.stderr, &cappedLog{f: logFile, limit: virtiofsdLogBytes, note: "\n[virtiofsd log truncated]\n"})
		stderrR.Close()
		logFile.Close()
		close(f.ioDone)
	}()
	go f.reap()
	defer func() {
		if retErr != nil {
			f.stop(context.Background())
		}
	}()
	// Our child, not yet reaped: its pid cannot have been reused.
	if f.pidfd, err = unix.PidfdOpen(cmd.Process.Pid, 0); err != nil {
		return nil, fmt.Errorf("virtiofsd pid %d: %w", cmd.Process.Pid, err)
	}
	pidPath := filepath.Join(spec.StateDir, VirtiofsdPIDFileName)
	made = append(made, pidPath)
	if err := writePIDFile(pidPath, cmd.Process.Pid); err != nil {
		return nil, err
	}
	return f, nil
}

// reap waits for the daemon to exit. A failure the driver did not cause
// leaves the guest's shared directories without a server: said loudly.
// A clean exit is the daemon ending after QEMU has gone.
func (f *virtiofsd) reap() {
	err := f.cmd.Wait()
	f.waitErr = err
	close(f.exited)
	if err != nil && !f.stopping.Load() {
		select {
		case <-f.ioDone:
		case <-time.After(ioDrainWait):
		}
		f.log.WithError(err).WithField("stderr", strings.Join(f.stderr.Tail(4), " | ")).
			Error("virtiofsd failed: the guest's shared directories have no server")
	}
}

// failure is why the daemon failed, if it exited on its own with an
// error within wait, else nil: a daemon that ends after QEMU has gone
// exits with status 0, and one the driver ended failed of nothing.
func (f *virtiofsd) failure(wait time.Duration) error {
	if f.stopping.Load() {
		return nil
	}
	select {
	case <-f.exited:
	case <-time.After(wait):
		return nil
	}
	if f.waitErr == nil {
		return nil
	}
	select {
	case <-f.ioDone:
	case <-time.After(ioDrainWait):
	}
	msg := fmt.Sprintf("virtiofsd (%s) failed: %v", f.cmd.Path, f.waitErr)
	if tail := f.stderr.Tail(8); len(tail) > 0 {
		msg += ": virtiofsd log: " + strings.Join(tail, " | ")
	}
	return errors.New(msg)
}

// expectExit tells the daemon's reaper that an exit from now on is the
// driver's doing: QEMU is being stopped, and the daemon ends with it.
func (f *virtiofsd) expectExit() { f.stopping.Store(true) }

// stop ends the daemon (see endVirtiofsd), reaps it and removes its
// socket and pid file, keeping its log. Called once QEMU is gone; safe to
// call again.
func (f *virtiofsd) stop(ctx context.Context) error {
	f.expectExit()
	var err error
	select {
	case <-f.exited:
	default:
		if f.pidfd >= 0 {
			err = endVirtiofsd(ctx, f.log, f.pidfd, f.cmd.Process.Pid)
		} else {
			// No pidfd: the process is our unreaped child, so
			// its pid is still its own.
			f.cmd.Process.Signal(syscall.SIGKILL)
		}
		if err == nil {
			select {
			case <-f.exited:
			case <-time.After(virtiofsdKillWait):
				err = fmt.Errorf("virtiofsd pid %d exited but was not reaped within %v", f.cmd.Process.Pid, virtiofsdKillWait)
			}
		}
	}
	if err == nil && f.pidfd >= 0 {
		unix.Close(f.pidfd)
		f.pidfd = -1
	}
	select {
	case <-f.ioDone:
	case <-time.After(ioDrainWait):
	}
	return errors.Join(err, removeFiles(f.log,
		filepath.Join(f.stateDir, VirtiofsSocketName),
		filepath.Join(f.stateDir, VirtiofsdPIDFileName),
	))
}

// endVirtiofsd ends the virtiofsd whose process (pid) fd is a pidfd of,
// and its worker, and returns once the process has exited. It first lets
// the daemon end by itself (QEMU has gone), then sends SIGTERM to the
// worker, whose exit ends the process too, which reaps it (to the process
// itself only while it has no worker: QEMU never connected), then SIGKILL
// to both. Without a deadline on ctx the steps wait virtiofsdExitWait and
// virtiofsdTermWait; with one, up to half of what is left and half of the
// rest. After SIGKILL it waits virtiofsdKillWait whatever ctx says.
func endVirtiofsd(ctx context.Context, lg *log.Entry, fd, pid int) error {
	exitWait, termWait := virtiofsdExitWait, virtiofsdTermWait
	if len(childrenOf(pid)) == 0 {
		// No worker: QEMU never connected, so nothing will close
		// and end the daemon.
		exitWait = 0
	}
	if dl, ok := ctx.Deadline(); ok {
		left := max(time.Until(dl), 0)
		exitWait = min(exitWait, left/2)
		termWait = min(termWait, (left-exitWait)/2)
	}
	for _, step := range []struct {
		sig  unix.Signal
		wait time.Duration
	}{{0, exitWait}, {unix.SIGTERM, termWait}, {unix.SIGKILL, virtiofsdKillWait}} {
		if step.sig != 0 {
			lg.WithField("signal", step.sig.String()).Info("virtiofsd still running; signalling it")
			if err := signalVirtiofsd(fd, pid, step.sig); err != nil {
				return err
			}
		}
		exited, err := pidfdWait(fd, step.wait)
		if err != nil {
			return fmt.Errorf("wait for virtiofsd pid %d: %w", pid, err)
		}
		if exited {
			return nil
		}
	}
	return fmt.Errorf("virtiofsd pid %d still runs %v after SIGKILL", pid, virtiofsdKillWait)
}

// signalVirtiofsd sends sig to the workers of the virtiofsd process pid
// (fd its pidfd), and to the process itself when it has none or sig is
// SIGKILL.
func signalVirtiofsd(fd, pid int, sig unix.Signal) error {
	workers := 0
	for _, child := range childrenOf(pid) {
		cfd, err := unix.PidfdOpen(child, 0)
		if err != nil {
			continue
		}
		// Opened first, checked after: the pidfd holds the process
		// it was opened on, so a pid reused since the scan is seen
		// here and left alone.
		if ppid, err := parentOf(child); err == nil && ppid == pid {
			if err := unix.PidfdSendSignal(cfd, sig, nil, 0); err == nil {
				workers++
			}
		}
		unix.Close(cfd)
	}
	if workers > 0 && sig != unix.SIGKILL {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal virtiofsd pid %d: %w", pid, err)
	}
	return nil
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p <= 1 {
			continue
		}
		if ppid, err := parentOf(p); err == nil && ppid == pid {
			out = append(out, p)
		}
	}
	return out
}

// parentOf reads pid's parent from /proc/<pid>/stat, whose second field
// (the command name, in parentheses) may hold anything.
func parentOf(pid int) (int, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	return strconv.Atoi(fields[1])
}

// isOurVirtiofsd says whether pid is a virtiofsd serving stateDir, judged
// from its environment (virtiofsdStateEnv), so that a recycled pid is
// never signalled. Its worker has the same environment.
func isOurVirtiofsd(pid int, stateDir string) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	want := virtiofsdStateEnv + "=" + stateDir
	for _, kv := range strings.Split(string(data), "\x00") {
		if kv == want {
			return true
		}
	}
	return false
}

// findVirtiofsd scans /proc for the virtiofsd processes of stateDir that
// a driver started (not their workers, whose parent is one of them).
func findVirtiofsd(stateDir string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	ours := map[int]bool{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 {
			continue
		}
		if isOurVirtiofsd(pid, stateDir) {
			ours[pid] = true
		}
	}
	var out []int
	for pid := range ours {
		if ppid, err := parentOf(pid); err != nil || !ours[ppid] {
			out = append(out, pid)
		}
	}
	return out
}

// cleanupVirtiofsd ends the virtiofsd of stateDir that no driver waits
// for (a crashed shim's, or one left by a launch cut short), found by
// its pid file or else by a scan of /proc, and removes its socket and pid
// file. Like killQEMU it signals only through a pidfd opened before the
// process is recognized as ours.
func cleanupVirtiofsd(ctx context.Context, lg *log.Entry, stateDir string) error {
	var pids []int
	if pid, err := readPIDFile(filepath.Join(stateDir, VirtiofsdPIDFileName)); err == nil {
		pids = []int{pid}
	} else {
		pids = findVirtiofsd(stateDir)
	}
	var errs []error
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		if errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("open virtiofsd pid %d: %w", pid, err))
			continue
		}
		if isOurVirtiofsd(pid, stateDir) {
			lg.WithField("virtiofsd_pid", pid).Info("stopping orphaned virtiofsd")
			if err := endVirtiofsd(ctx, lg.WithField("virtiofsd_pid", pid), fd, pid); err != nil {
				errs = append(errs, err)
			}
		}
		unix.Close(fd)
	}
	errs = append(errs, removeFiles(lg,
		filepath.Join(stateDir, VirtiofsSocketName),
		filepath.Join(stateDir, VirtiofsdPIDFileName),
		filepath.Join(stateDir, VirtiofsdPIDFileName+".tmp"),
	))
	return errors.Join(errs...)
}
