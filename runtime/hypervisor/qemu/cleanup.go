package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// How long Cleanup waits after SIGTERM, then after SIGKILL.
const (
	cleanupTermWait = 2 * time.Second
	cleanupKillWait = 5 * time.Second
)

// Cleanup ends the QEMU of stateDir, if one still runs, then its virtiofsd,
// and removes their sockets and pid files, keeping the logs. It needs
// nothing but the state dir, for a `shim delete` after the shim that
// launched the VM died: QEMU is then no longer its child.
//
// The pid comes from the pid file, or, if that is missing (a shim killed
// between starting QEMU and writing it), from a scan of /proc. A pid is only
// signalled after its command line shows it is QEMU serving this state dir,
// and through a pidfd opened before that check, so a recycled pid is never
// hit. QEMU gets SIGTERM (it exits cleanly on it, flushing its disks), then
// SIGKILL. Safe to call when nothing runs.
func Cleanup(ctx context.Context, stateDir string) error {
	lg := log.G(ctx).WithField("state_dir", stateDir)
	pid, err := readPIDFile(filepath.Join(stateDir, PIDFileName))
	if err != nil {
		pid = findQEMU(stateDir)
	}
	if pid > 0 {
		if err := killQEMU(lg, pid, stateDir); err != nil {
			return err
		}
	}
	// After QEMU, whose going away ends the daemon by itself.
	if err := cleanupVirtiofsd(ctx, lg, stateDir); err != nil {
		return err
	}
	return removeFiles(lg,
		filepath.Join(stateDir, QMPSocketName),
		filepath.Join(stateDir, AgentSocketName),
		filepath.Join(stateDir, PIDFileName),
		filepath.Join(stateDir, PIDFileName+".tmp"),
		filepath.Join(stateDir, NameFileName),
	)
}

func killQEMU(lg *log.Entry, pid int, stateDir string) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open qemu pid %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if !isOurQEMU(pid, stateDir) {
		lg.WithField("pid", pid).Info("pid in qemu pid file is not this sandbox's qemu; leaving it alone")
		return nil
	}
	lg = lg.WithField("pid", pid)
	for _, step := range []struct {
		sig  unix.Signal
		wait time.Duration
	}{{unix.SIGTERM, cleanupTermWait}, {unix.SIGKILL, cleanupKillWait}} {
		if err := unix.PidfdSendSignal(fd, step.sig, nil, 0); err != nil {
			if errors.Is(err, unix.ESRCH) {
				return nil
			}
			return fmt.Errorf("signal qemu pid %d: %w", pid, err)
		}
		lg.WithField("signal", step.sig.String()).Info("stopping orphaned qemu")
		if exited, err := pidfdWait(fd, step.wait); err != nil {
			return fmt.Errorf("wait for qemu pid %d: %w", pid, err)
		} else if exited {
			return nil
		}
	}
	return fmt.Errorf("qemu pid %d still runs %v after SIGKILL", pid, cleanupKillWait)
}

// pidfdWait waits up to d for the process to exit; a pidfd turns readable
// when it does, whether or not it is our child.
func pidfdWait(fd int, d time.Duration) (bool, error) {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left < 0 {
			left = 0
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, err
		}
		if n > 0 {
			return true, nil
		}
		if left == 0 {
			return false, nil
		}
	}
}

// findQEMU scans /proc for the QEMU of stateDir; 0 if none.
func findQEMU(stateDir string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 {
			continue
		}
		if isOurQEMU(pid, stateDir) {
			return pid
		}
	}
	return 0
}

// Running returns the pid of the QEMU serving stateDir, or 0 if none runs.
// Like Cleanup it trusts a pid only once /proc shows it is that QEMU.
func Running(stateDir string) int {
	if pid, err := readPIDFile(filepath.Join(stateDir, PIDFileName)); err == nil && isOurQEMU(pid, stateDir) {
		return pid
	}
	return findQEMU(stateDir)
}
