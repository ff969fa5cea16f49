package hooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// outputGrace is how long a hook's output is still read once the hook has
// exited or been killed. A process it left behind (in its group or not)
// may hold its stdout open for as long as it lives; the shim must not wait
// on that.
const outputGrace = time.Second

// runOne runs hook i of kind k, an already validated h, with stdin on its
// stdin and bundle as its working directory (if it is one), and returns
// its failure, if any, as a *hookError.
func runOne(ctx context.Context, k Kind, i int, h specs.Hook, stdin []byte, bundle string) error {
	lg := log.G(ctx).WithFields(log.Fields{"hook_kind": k, "hook_index": i, "hook_path": h.Path})
	hctx := ctx
	if d, ok := timeout(h); ok {
		var cancel context.CancelFunc
		hctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	out := newTail(outputMax)
	cmd := command(hctx, h, stdin, bundle, out)

	lg.Debug("running hook")
	start := time.Now()
	err := cmd.Start()
	started := err == nil
	if started {
		err = cmd.Wait()
	}
	lg = lg.WithField("duration", time.Since(start))
	if errors.Is(err, exec.ErrWaitDelay) {
		lg.Debug("hook exited leaving its output open; stopped reading it")
	}

	herr := failure(ctx, hctx, h, started, err)
	if herr == nil {
		lg.Debug("hook done")
		return nil
	}
	herr.kind, herr.index, herr.path = k, i, h.Path
	herr.output, herr.cut = out.text()
	lg.WithError(herr).Debug("hook failed")
	return herr
}

// timeout returns h's timeout as a duration, and false if it has none (or
// one too long to be one: hundreds of years).
func timeout(h specs.Hook) (time.Duration, bool) {
	if h.Timeout == nil || int64(*h.Timeout) > math.MaxInt64/int64(time.Second) {
		return 0, false
	}
	return time.Duration(*h.Timeout) * time.Second, true
}

// command returns the command that runs h under ctx: h's argv and
// environment and nothing else, stdin on its stdin, out as both its stdout
// and stderr (one pipe: the two interleave as the hook wrote them), in a
// process group of its own that ctx's end kills whole.
func command(ctx context.Context, h specs.Hook, stdin []byte, bundle string, out *tail) *exec.Cmd {
	cmd := exec.CommandContext(ctx, h.Path)
	cmd.Args = h.Args
	if len(cmd.Args) == 0 {
		cmd.Args = []string{h.Path}
	}
	// A nil Env would hand the hook the shim's environment; the
	// runtime-spec's env is the hook's whole environment.
	cmd.Env = append([]string{}, h.Env...)
	cmd.Dir = workDir(bundle)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	cmd.WaitDelay = outputGrace
	return cmd
}

// workDir is where a hook runs: the bundle, as under runc (which runs in
// it), when it is an absolute path to a directory; else "/".
func workDir(bundle string) string {
	if filepath.IsAbs(bundle) {
		if fi, err := os.Stat(bundle); err == nil && fi.IsDir() {
			return bundle
		}
	}
	return "/"
}

// killGroup kills the process group that the hook of pid leads, so that
// what the hook started dies with it. The group outlives its leader while
// any of its members does, so its id is not reused meanwhile.
func killGroup(pid int) error {
	err := unix.Kill(-pid, unix.SIGKILL)
	if errors.Is(err, unix.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// failure says how hook h failed, from the error of its Start (if not
// started) or of its Wait, ctx being the caller's context and hctx the
// hook's own (ctx bounded by h's timeout); nil if it did not fail.
func failure(ctx, hctx context.Context, h specs.Hook, started bool, err error) *hookError {
	switch {
	case err == nil:
		return nil
	case started && errors.Is(err, exec.ErrWaitDelay):
		// The hook exited 0; only what it left behind held its output.
		return nil
	case ctx.Err() != nil:
		how := "killed"
		if !started {
			how = "not started"
		}
		return &hookError{how: how + ": " + context.Cause(ctx).Error(), cause: ctx.Err()}
	case hctx.Err() != nil:
		return &hookError{how: fmt.Sprintf("timed out after %ds", *h.Timeout), class: errdefs.ErrFailedPrecondition}
	case !started:
		return &hookError{how: "could not start: " + err.Error(), class: errdefs.ErrFailedPrecondition, cause: err}
	}
	how := err.Error()
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
		how = exitStatus(exit.ProcessState)
	}
	return &hookError{how: how, class: errdefs.ErrFailedPrecondition, cause: err}
}

// exitStatus says how a process ended: "exit status 2", "killed by signal
// 9 (SIGKILL)".
func exitStatus(ps *os.ProcessState) string {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("killed by signal %d (%s)", ws.Signal(), unix.SignalName(ws.Signal()))
	}
	return fmt.Sprintf("exit status %d", ps.ExitCode())
}
