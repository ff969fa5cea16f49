package qemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/nice"
)

// A VM passes from one process to another (a spare VM, launched and
// warmed ahead of need, claimed by a sandbox's shim) as a Handoff and
// three files, in this order: a pidfd of QEMU, and the read ends of its
// stdout (the guest console) and stderr pipes. QMP is not passed: the
// detaching side closes its connection and the adopting side opens its
// own on the socket. QEMU stays the child of the process that launched
// it, or is reparented when that exits; the adopting side waits for its
// exit through the pidfd, which turns readable when QEMU exits whoever
// reaps it. Its exit status is then unknown, and ExitError says so from
// what it does know (QEMU's SHUTDOWN event, the signals it sent).
const (
	handoffPIDFD = iota
	handoffStdout
	handoffStderr
	handoffFiles
)

// process is QEMU's process as a VM holds it.
type process interface {
	pid() int
	// signal sends sig; os.ErrProcessDone once the process is gone.
	signal(sig syscall.Signal) error
	// wait returns once the process has exited.
	wait() error
}

// childProcess is a QEMU this process launched.
type childProcess struct{ cmd *exec.Cmd }

func (c childProcess) pid() int                        { return c.cmd.Process.Pid }
func (c childProcess) signal(sig syscall.Signal) error { return c.cmd.Process.Signal(sig) }
func (c childProcess) wait() error                     { return c.cmd.Wait() }

// adoptedProcess is a QEMU that another process launched, known by a
// pidfd.
type adoptedProcess struct {
	p  int
	fd *os.File
}

func (a adoptedProcess) pid() int { return a.p }

func (a adoptedProcess) signal(sig syscall.Signal) error {
	err := unix.PidfdSendSignal(int(a.fd.Fd()), sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

func (a adoptedProcess) wait() error {
	for {
		if exited, err := pidfdWait(int(a.fd.Fd()), time.Hour); err != nil {
			return fmt.Errorf("wait for qemu pid %d: %w", a.p, err)
		} else if exited {
			return nil
		}
	}
}

// Detach hands QEMU over to another process: the console and stderr
// pumps stop and their pipes are returned, QMP is closed, and a pidfd of
// QEMU is opened. QEMU runs on; the VM must not be used again here. A
// VM with a virtio-fs share cannot be detached.
func (v *VM) Detach() (hypervisor.Handoff, []*os.File, error) {
	var h hypervisor.Handoff
	if v.fs != nil {
		return h, nil, fmt.Errorf("a vm that shares host directories cannot be handed over: %w", errdefs.ErrNotImplemented)
	}
	select {
	case <-v.exited:
		return h, nil, fmt.Errorf("%w: qemu exited before it was handed over", hypervisor.ErrVMExited)
	default:
	}
	pidfd, err := unix.PidfdOpen(v.PID(), 0)
	if err != nil {
		return h, nil, fmt.Errorf("open a pidfd of qemu pid %d: %w", v.PID(), err)
	}
	pf := os.NewFile(uintptr(pidfd), "qemu-pidfd")
	// The pumps' reads end at the deadline and leave the pipes open.
	v.detaching.Store(true)
	now := time.Now()
	_ = v.stdout.SetReadDeadline(now)
	_ = v.stderr.SetReadDeadline(now)
	select {
	case <-v.ioDone:
	case <-time.After(ioDrainWait):
		pf.Close()
		return h, nil, errors.New("the qemu console pumps did not stop")
	}
	_ = v.stdout.SetReadDeadline(time.Time{})
	_ = v.stderr.SetReadDeadline(time.Time{})
	v.qmp.Close()
	<-v.qmpClosed
	ep := v.endpoint
	if ep.Kind == channel.Serial {
		ep.SocketPath = AgentSocketName
	}
	h = hypervisor.Handoff{
		Driver: DriverName, PID: v.PID(), Name: v.name, StateDir: v.stateDir,
		Machine: v.machine, Endpoint: ep, Memory: v.memory,
	}
	files := make([]*os.File, handoffFiles)
	files[handoffPIDFD], files[handoffStdout], files[handoffStderr] = pf, v.stdout, v.stderr
	return h, files, nil
}

// Adopt takes over the QEMU of a Handoff whose state directory has been
// moved to stateDir: it checks that the pidfd is that QEMU's, drains its
// console (appending to the console log) and stderr, waits for its exit
// through the pidfd, records its pid and name for Cleanup, and connects
// to QMP. On error QEMU is killed and the files it was given closed.
func (d *Driver) Adopt(ctx context.Context, h hypervisor.Handoff, files []*os.File, stateDir string) (_ hypervisor.VM, retErr error) {
	closeAll := func() { closeFiles(files) }
	if h.Driver != DriverName || len(files) != handoffFiles || h.PID <= 1 || h.Name == "" {
		closeAll()
		return nil, fmt.Errorf("%w: not a qemu handoff (driver %q, pid %d, %d files)", errdefs.ErrInvalidArgument, h.Driver, h.PID, len(files))
	}
	lg := log.G(ctx).WithField("pid", h.PID)
	pf := files[handoffPIDFD]
	if got, err := pidfdPID(pf); err != nil || got != h.PID || !hasName(h.PID, h.Name) {
		closeAll()
		return nil, fmt.Errorf("%w: the pidfd handed over is not qemu pid %d named %q (%v)", errdefs.ErrInvalidArgument, h.PID, h.Name, err)
	}
	proc := adoptedProcess{p: h.PID, fd: pf}
	consoleFile, err := os.OpenFile(filepath.Join(stateDir, ConsoleLogName), os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		_ = proc.signal(syscall.SIGKILL)
		closeAll()
		return nil, fmt.Errorf("open console log: %w", err)
	}
	written := int64(0)
	if fi, err := consoleFile.Stat(); err == nil {
		written = fi.Size()
	}
	v := &VM{
		id:        filepath.Base(stateDir),
		memory:    h.Memory,
		stateDir:  stateDir,
		proc:      proc,
		name:      h.Name,
		log:       lg,
		console:   newRing(consoleRingBytes),
		stderrLog: newRing(stderrRingBytes),
		exited:    make(chan struct{}),
		ioDone:    make(chan struct{}),
		stopSem:   make(chan struct{}, 1),
		qmpClosed: make(chan struct{}),
		machine:   h.Machine,
		endpoint:  h.Endpoint,
	}
	if v.endpoint.Kind == channel.Serial {
		v.endpoint.SocketPath = filepath.Join(stateDir, AgentSocketName)
	}
	v.startPumps(files[handoffStdout], files[handoffStderr], &cappedLog{f: consoleFile, limit: DefaultConsoleLogBytes, written: written})
	go v.reap()
	defer func() {
		if retErr != nil {
			v.kill()
			pf.Close()
			_ = removeFiles(lg, filepath.Join(stateDir, PIDFileName), filepath.Join(stateDir, NameFileName))
		}
	}()
	// The name first: from then on Cleanup knows this QEMU as the state
	// directory's, whatever the pid file says.
	if err := os.WriteFile(filepath.Join(stateDir, NameFileName), []byte(h.Name+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("record qemu's name: %w", err)
	}
	if err := writePIDFile(filepath.Join(stateDir, PIDFileName), h.PID); err != nil {
		return nil, err
	}
	client, err := v.waitQMP(ctx, filepath.Join(stateDir, QMPSocketName))
	if err != nil {
		return nil, err
	}
	v.qmp = client
	if got := client.Greeting().Version.String(); got != h.Machine.Version {
		return nil, fmt.Errorf("%w: qemu pid %d says it is version %s, its handoff %s", errdefs.ErrInvalidArgument, h.PID, got, h.Machine.Version)
	}
	go v.watchEvents()
	// A spare is made at the lowest priority, so as not to slow the
	// start that asked for it: the adopter's VM runs at its own.
	if err := setOwnPriority(h.PID); err != nil {
		lg.WithError(err).Warn("set the adopted qemu's priority")
	}
	lg.WithField("state_dir", stateDir).Info("qemu adopted")
	return v, nil
}

// pidfdPID reads the pid a pidfd refers to from /proc/self/fdinfo.
func pidfdPID(f *os.File) (int, error) {
	fi, err := os.Open("/proc/self/fdinfo/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		return 0, err
	}
	defer fi.Close()
	sc := bufio.NewScanner(fi)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("not a pidfd")
}

// setOwnPriority gives every thread of pid this thread's nice value.
func setOwnPriority(pid int) error {
	n, err := nice.Own()
	if err != nil {
		return err
	}
	return nice.Set(pid, n)
}
