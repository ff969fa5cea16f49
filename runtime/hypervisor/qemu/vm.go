package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu/qmp"
)

// Stop's escalation budget when ctx has no deadline; with a deadline each
// step gets a share of what is left (see Stop).
const (
	quitGrace = 2 * time.Second
	termGrace = 2 * time.Second
	killGrace = 5 * time.Second
)

// ioDrainWait bounds how long exit handling waits for the console and stderr
// pipes to drain after QEMU exited. They reach EOF at once unless something
// else inherited them, which -sandbox spawn=deny rules out.
const ioDrainWait = time.Second

// VM is one QEMU process. Beyond hypervisor.VM it offers QMP for features
// that need the VMM itself (snapshots, disks).
type VM struct {
	id       string
	stateDir string
	// proc is the QEMU process: a child of this process, or one adopted
	// from the spare that launched it (handoff.go).
	proc process
	// name is QEMU's -name, which tells it from any other process.
	name string
	// stdout and stderr are the read ends of QEMU's console and stderr
	// pipes, which the pumps drain; Detach hands them over.
	stdout, stderr *os.File
	endpoint       channel.Endpoint
	// log carries the sandbox id and pid; it outlives the Launch context.
	log *log.Entry
	// qmp is set once Launch returns and never changes.
	qmp *qmp.Client
	// machine is what Machine reports; set with qmp.
	machine hypervisor.Machine
	// memory is Spec.Memory: guest RAM in a file, or nil.
	memory *hypervisor.MemoryFile
	// fs serves Spec.Share; nil without one. Stop ends it after QEMU.
	fs *virtiofsd

	console   *ring // last 64 KiB of the guest console
	stderrLog *ring // last 16 KiB of QEMU's stderr
	// detaching is set by Detach before it stops the pumps: their pipes
	// are then handed over, not closed.
	detaching atomic.Bool

	exited    chan struct{} // closed when QEMU has exited and been reaped
	ioDone    chan struct{} // closed when console and stderr reached EOF
	qmpClosed chan struct{} // closed when the event watcher has finished
	// stopSem serializes Stop calls while letting each wait on its own
	// context rather than a mutex.
	stopSem chan struct{}

	// mu guards the fields below.
	mu sync.Mutex
	// waitErr is the process's wait result, valid once exited is
	// closed.
	waitErr error
	// sentSignal is the last signal Stop (or a failed Launch) sent, so
	// that ExitError can tell a kill we asked for from one we did not.
	sentSignal syscall.Signal
	// shutdownReason is the reason of QEMU's last SHUTDOWN event.
	shutdownReason string
	// exitErr caches ExitError once computed.
	exitErr     error
	exitErrDone bool
}

var _ hypervisor.VM = (*VM)(nil)

// PID is QEMU's process id.
func (v *VM) PID() int { return v.proc.pid() }

// AgentEndpoint says how to reach the guest agent.
func (v *VM) AgentEndpoint() channel.Endpoint { return v.endpoint }

// Exited is closed as soon as QEMU has exited.
func (v *VM) Exited() <-chan struct{} { return v.exited }

// QMP is QEMU's control connection, for features beyond hypervisor.VM
// (migrate, blockdev-add, device_add onto SCSIControllerID). It is closed
// by Stop.
func (v *VM) QMP() *qmp.Client { return v.qmp }

// ShutdownReason is the reason QEMU gave in its last SHUTDOWN event:
// "guest-shutdown" (power-off), "guest-reset" (reboot, or a kernel panic,
// since the guest runs with panic=-1), "host-qmp-quit" (Stop),
// "host-signal", or "" if QEMU exited without one (killed).
func (v *VM) ShutdownReason() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.shutdownReason
}

// ConsoleTail returns up to n of the last lines of the guest console.
func (v *VM) ConsoleTail(n int) []string { return v.console.Tail(n) }

// ExitError says how QEMU exited, once Exited is closed: nil when it exited
// with status 0 (guest power-off, guest reset under -no-reboot, or Stop);
// otherwise the exit status or signal, or a termination signal sent by
// another process, with the tail of QEMU's stderr, wrapping
// hypervisor.ErrVMExited.
func (v *VM) ExitError() error {
	select {
	case <-v.exited:
	default:
		return nil
	}
	v.mu.Lock()
	if v.exitErrDone {
		defer v.mu.Unlock()
		return v.exitErr
	}
	v.mu.Unlock()

	// Let stderr drain so that QEMU's last words are in the error, and
	// the event watcher see the SHUTDOWN event.
	drain := time.After(ioDrainWait)
	select {
	case <-v.ioDone:
	case <-drain:
	}
	if v.qmp != nil {
		select {
		case <-v.qmpClosed:
		case <-drain:
		}
	}

	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.exitErrDone {
		v.exitErr = describeExit(v.waitErr, v.sentSignal, v.shutdownReason, v.stderrLog)
		v.exitErrDone = true
	}
	return v.exitErr
}

func describeExit(waitErr error, sent syscall.Signal, reason string, stderr *ring) error {
	if waitErr == nil {
		// QEMU exits 0 on SIGTERM/SIGINT/SIGHUP too. A clean exit is one
		// the guest asked for (guest-*), or the driver did (its QMP quit,
		// or a signal it sent). A signal from anyone else, or an exit
		// with no SHUTDOWN event seen at all, ended the VM from outside.
		switch {
		case sent != 0, strings.HasPrefix(reason, "guest-"), reason == "host-qmp-quit":
			return nil
		case reason == "host-signal":
			return fmt.Errorf("%w: qemu terminated by a signal from another process%s", hypervisor.ErrVMExited, stderrSuffix(stderr))
		}
		return fmt.Errorf("%w: qemu exited without a shutdown request from the guest or the driver%s", hypervisor.ErrVMExited, stderrSuffix(stderr))
	}
	var ee *exec.ExitError
	if !errors.As(waitErr, &ee) {
		return fmt.Errorf("%w: wait for qemu: %v", hypervisor.ErrVMExited, waitErr)
	}
	var what string
	ws, ok := ee.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		what = "qemu killed by signal " + ws.Signal().String()
		if ws.Signal() == sent {
			what += " (sent by the driver while stopping it)"
		}
	default:
		what = fmt.Sprintf("qemu exited with status %d", ee.ExitCode())
	}
	return fmt.Errorf("%w: %s%s", hypervisor.ErrVMExited, what, stderrSuffix(stderr))
}

// stderrSuffix renders the tail of QEMU's stderr for an error message.
func stderrSuffix(stderr *ring) string {
	lines := stderr.Tail(8)
	if len(lines) == 0 {
		return ""
	}
	return ": qemu stderr: " + strings.Join(lines, " | ")
}

// startPumps drains QEMU's stdout (the guest console) and stderr until
// they reach EOF, or until Detach stops them.
func (v *VM) startPumps(stdout, stderr *os.File, consoleLog *cappedLog) {
	v.stdout, v.stderr = stdout, stderr
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		pumpConsole(stdout, v.console, consoleLog)
		if !v.detaching.Load() {
			stdout.Close()
		}
		consoleLog.f.Close()
	}()
	go func() {
		defer wg.Done()
		pumpStderr(stderr, v.stderrLog, func(line string) {
			v.log.WithField("stderr", line).Warn("qemu")
		})
		if !v.detaching.Load() {
			stderr.Close()
		}
	}()
	go func() {
		wg.Wait()
		close(v.ioDone)
	}()
}

// reap waits for QEMU to exit. It runs from start to exit, so an external
// kill is noticed at once.
func (v *VM) reap() {
	err := v.proc.wait()
	v.mu.Lock()
	v.waitErr = err
	v.mu.Unlock()
	close(v.exited)
	v.log.WithError(err).Debug("qemu exited")
}

// watchEvents records lifecycle events until QMP closes.
func (v *VM) watchEvents() {
	defer close(v.qmpClosed)
	events, cancel := v.qmp.Subscribe(qmp.DefaultEventBuffer)
	defer cancel()
	for ev := range events {
		switch ev.Name {
		case qmp.EventShutdown:
			var d qmp.ShutdownData
			if err := json.Unmarshal(ev.Data, &d); err == nil {
				v.mu.Lock()
				v.shutdownReason = d.Reason
				v.mu.Unlock()
			}
			v.log.WithField("reason", d.Reason).Info("guest shut down")
		case qmp.EventGuestPanicked:
			v.log.Warn("guest kernel panicked")
		case qmp.EventStop, qmp.EventResume, qmp.EventReset:
			v.log.WithField("event", ev.Name).Debug("qemu event")
		}
	}
}

// signal sends sig to QEMU and remembers it for ExitError. Both kinds of
// process signal through a pidfd, so a reaped and recycled pid is never
// hit. QEMU runs with spawn=deny and so has no children to signal.
func (v *VM) signal(sig syscall.Signal) {
	v.mu.Lock()
	v.sentSignal = sig
	v.mu.Unlock()
	if err := v.proc.signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		v.log.WithError(err).WithField("signal", sig.String()).Warn("signal qemu")
	}
}

// kill ends QEMU at once and waits for it and its pipes; used when Launch
// fails.
func (v *VM) kill() {
	v.signal(syscall.SIGKILL)
	<-v.exited
	if v.qmp != nil {
		v.qmp.Close()
	}
	select {
	case <-v.ioDone:
	case <-time.After(ioDrainWait):
	}
}

// Stop ends QEMU if it still runs, then the share's virtiofsd, and removes
// the sockets and pid files, keeping the logs. It asks QEMU to quit over QMP (the guest is not
// told: the sandbox has already asked the agent to shut down), then sends
// SIGTERM, then SIGKILL. Without a deadline on ctx quit and SIGTERM get 2 s
// each; with one, quit gets up to half of the time left and SIGTERM up to
// half of the rest. After SIGKILL it waits up to 5 s whatever ctx says, so
// that even a late Stop reaps QEMU and removes its files. Safe to call more
// than once and concurrently.
func (v *VM) Stop(ctx context.Context) error {
	select {
	case v.stopSem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("stop qemu: %w", ctx.Err())
	}
	defer func() { <-v.stopSem }()

	if v.fs != nil {
		v.fs.expectExit()
	}
	if err := v.terminate(ctx); err != nil {
		return err
	}
	v.qmp.Close()
	select {
	case <-v.qmpClosed:
	case <-ctx.Done():
	}
	select {
	case <-v.ioDone:
	case <-time.After(ioDrainWait):
		v.log.Warn("qemu console pipes still open after exit")
	}
	err := removeFiles(v.log,
		filepath.Join(v.stateDir, QMPSocketName),
		filepath.Join(v.stateDir, AgentSocketName),
		filepath.Join(v.stateDir, PIDFileName),
		filepath.Join(v.stateDir, NameFileName),
	)
	if v.fs != nil {
		err = errors.Join(err, v.fs.stop(ctx))
	}
	return err
}

// terminate escalates until QEMU has exited.
func (v *VM) terminate(ctx context.Context) error {
	select {
	case <-v.exited:
		return nil
	default:
	}
	quitWait, termWait := quitGrace, termGrace
	if dl, ok := ctx.Deadline(); ok {
		left := max(time.Until(dl), 0)
		quitWait = min(quitGrace, left/2)
		termWait = min(termGrace, (left-quitWait)/2)
	}

	qctx, cancel := context.WithTimeout(ctx, quitWait)
	err := v.qmp.Quit(qctx)
	cancel()
	if err != nil {
		v.log.WithError(err).Debug("qmp quit failed; signalling qemu")
	} else if v.waitExit(ctx, quitWait) {
		return nil
	}

	v.log.Warn("qemu still running after quit; sending SIGTERM")
	v.signal(syscall.SIGTERM)
	if v.waitExit(ctx, termWait) {
		return nil
	}

	v.log.Warn("qemu still running after SIGTERM; sending SIGKILL")
	v.signal(syscall.SIGKILL)
	// SIGKILL cannot be ignored and reaping follows at once, so this
	// wait does not depend on ctx: even a Stop whose ctx has expired
	// gets QEMU reaped and its files removed.
	if v.waitExit(context.Background(), killGrace) {
		return nil
	}
	return fmt.Errorf("stop qemu pid %d: still running %v after SIGKILL", v.PID(), killGrace)
}

// waitExit waits up to d (and no longer than ctx) for QEMU to exit.
func (v *VM) waitExit(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-v.exited:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	select {
	case <-v.exited:
		return true
	default:
		return false
	}
}
