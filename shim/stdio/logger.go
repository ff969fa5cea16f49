package stdio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// How long a logging binary gets to finish after its pipes reach EOF,
// and then after SIGTERM, before it is killed. containerd's runc shim
// gives it 12 s after SIGTERM.
const (
	loggerDrainWait = 2 * time.Second
	loggerTermWait  = 10 * time.Second
)

// logger is a running logging binary (containerd's shim logging protocol):
// it reads the container's stdout on fd 3 and stderr on fd 4, and says it
// is ready by writing a byte to (binary-v2) or closing (binary) fd 5. Its
// environment is CONTAINER_ID and CONTAINER_NAMESPACE; the URI's query
// gives its arguments.
type logger struct {
	cmd *exec.Cmd
	// stdout and stderr are the write ends of its pipes.
	stdout, stderr *os.File
	// exited is closed when cmd has been waited for; err is then set.
	exited chan struct{}
	err    error
}

func startLogger(ctx context.Context, u *url.URL, ns, id string) (_ *logger, retErr error) {
	if u.Path == "" {
		return nil, fmt.Errorf("logging binary %q: %w: no path", u.String(), errdefs.ErrInvalidArgument)
	}
	var closers []io.Closer
	defer func() {
		if retErr != nil {
			for _, c := range closers {
				_ = c.Close()
			}
		}
	}()
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err == nil {
			closers = append(closers, r, w)
		}
		return r, w, err
	}
	outR, outW, err := pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := pipe()
	if err != nil {
		return nil, err
	}
	readyR, readyW, err := pipe()
	if err != nil {
		return nil, err
	}

	var args []string
	for k, vs := range u.Query() {
		args = append(args, k)
		if len(vs) > 0 {
			args = append(args, vs[0])
		}
	}
	cmd := exec.Command(u.Path, args...)
	cmd.Env = []string{"CONTAINER_ID=" + id, "CONTAINER_NAMESPACE=" + ns}
	cmd.ExtraFiles = []*os.File{outR, errR, readyW}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start logging binary %s: %w", u.Path, err)
	}
	l := &logger{cmd: cmd, stdout: outW, stderr: errW, exited: make(chan struct{})}
	go func() {
		l.err = cmd.Wait()
		close(l.exited)
	}()
	defer func() {
		if retErr != nil {
			_ = cmd.Process.Kill()
		}
	}()
	// Only the logger keeps these.
	_ = outR.Close()
	_ = errR.Close()
	_ = readyW.Close()

	ready := make(chan error, 1)
	go func() {
		defer readyR.Close()
		b := make([]byte, 1)
		n, err := readyR.Read(b)
		switch {
		case err != nil && !errors.Is(err, io.EOF):
			ready <- fmt.Errorf("logging binary %s: %w", u.Path, err)
		case u.Scheme == "binary-v2" && n == 0:
			ready <- fmt.Errorf("logging binary %s exited or closed fd 5 without saying it is ready", u.Path)
		default:
			ready <- nil
		}
	}()
	select {
	case err := <-ready:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for logging binary %s to be ready: %w", u.Path, ctx.Err())
	}
	log.G(ctx).WithField("logger", u.Path).WithField("logger_pid", cmd.Process.Pid).Debug("logging binary ready")
	return l, nil
}

// wait gives the logger time to finish after its pipes were closed, then
// asks it to stop (SIGTERM), then kills it.
func (l *logger) wait(ctx context.Context) error {
	for _, step := range []struct {
		sig  syscall.Signal
		wait time.Duration
	}{{0, loggerDrainWait}, {syscall.SIGTERM, loggerTermWait}, {syscall.SIGKILL, loggerTermWait}} {
		if step.sig != 0 {
			log.G(ctx).WithField("logger_pid", l.cmd.Process.Pid).WithField("signal", step.sig.String()).Warn("logging binary did not exit after its output ended")
			_ = l.cmd.Process.Signal(step.sig)
		}
		t := time.NewTimer(step.wait)
		select {
		case <-l.exited:
			t.Stop()
			return l.exitErr()
		case <-ctx.Done():
			t.Stop()
			_ = l.cmd.Process.Kill()
			return fmt.Errorf("wait for logging binary: %w", ctx.Err())
		case <-t.C:
		}
	}
	return fmt.Errorf("logging binary pid %d did not exit after SIGKILL", l.cmd.Process.Pid)
}

// exitErr is the logger's exit, where ending on our SIGTERM is no error.
func (l *logger) exitErr() error {
	var ee *exec.ExitError
	if errors.As(l.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	if l.err != nil {
		return fmt.Errorf("logging binary: %w", l.err)
	}
	return nil
}
