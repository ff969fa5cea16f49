//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/agent/reaper"
)

// Bounds on what a runc call returns to the agent.
const (
	maxRuncOutput = 1 << 20
	maxRuncStderr = 64 << 10
	// runcLogTail is how much of a call's log is searched for its error.
	runcLogTail = 64 << 10
	// runcPipeDrain bounds the wait for a finished runc's output pipes,
	// which a process it left behind could hold open.
	runcPipeDrain = 2 * time.Second
)

// runc drives the runc CLI. It is a small wrapper of its own rather than
// containerd's go-runc because every runc process must be started through
// the agent's reaper (the only waiter for children of PID 1): go-runc runs
// exec.Cmd, whose Wait races the reaper, behind a package-level monitor.
type runc struct {
	// path is the runc binary.
	path string
	// root is runc's state directory (--root).
	root string
	// noPivot passes --no-pivot to create: the agent's root is the
	// initramfs, which pivot_root cannot leave.
	noPivot bool
	// reaper starts every runc process and collects its exit.
	reaper *reaper.Reaper
	// seq numbers the calls' log files.
	seq atomic.Uint64
}

// runcCall is one invocation of runc.
type runcCall struct {
	// args follow runc's global flags.
	args []string
	// logDir receives the call's log file (removed afterwards).
	logDir string
	// stdio, if set, are runc's fds 0-2, which it hands on to the
	// container process it starts. Otherwise stdin is stdinData (or
	// /dev/null) and stdout and stderr are captured.
	stdio *[3]*os.File
	// stdinData is written to runc's stdin when stdio is nil.
	stdinData []byte
}

// runcError is a failed runc call.
type runcError struct {
	// cmd is runc's command (create, start...).
	cmd string
	// msg is the error runc logged, or its stderr.
	msg string
	// err is how the call failed (runc's exit status).
	err error
}

func (e *runcError) Error() string {
	if e.msg == "" {
		return fmt.Sprintf("runc %s: %v", e.cmd, e.err)
	}
	return fmt.Sprintf("runc %s: %s", e.cmd, e.msg)
}

func (e *runcError) Unwrap() error { return e.err }

// run runs one runc command and returns its stdout (when captured). A
// cancelled ctx kills runc.
func (r *runc) run(ctx context.Context, c runcCall) (_ []byte, retErr error) {
	cmd := c.args[0]
	logPath := filepath.Join(c.logDir, fmt.Sprintf("runc-%d.log", r.seq.Add(1)))
	defer os.Remove(logPath)
	argv := append([]string{r.path, "--root", r.root, "--log", logPath, "--log-format", "json"}, c.args...)

	var (
		files   [3]*os.File
		ours    []*os.File // the child's ends, closed once it runs
		outputs []*os.File // our read ends
		stdout  bytes.Buffer
		stderr  bytes.Buffer
	)
	defer func() {
		for _, f := range ours {
			_ = f.Close()
		}
		for _, f := range outputs {
			_ = f.Close()
		}
	}()
	if c.stdio != nil {
		files = *c.stdio
	} else {
		null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
		if err != nil {
			return nil, err
		}
		ours = append(ours, null)
		files[0] = null
		if c.stdinData != nil {
			pr, pw, err := os.Pipe()
			if err != nil {
				return nil, fmt.Errorf("runc %s: stdin pipe: %w", cmd, err)
			}
			ours = append(ours, pr)
			files[0] = pr
			go func(data []byte) {
				// runc reads its input to EOF before acting; if it
				// fails first, the write fails and that is all.
				_, _ = pw.Write(data)
				_ = pw.Close()
			}(c.stdinData)
		}
		for i := 1; i <= 2; i++ {
			pr, pw, err := os.Pipe()
			if err != nil {
				return nil, fmt.Errorf("runc %s: output pipe: %w", cmd, err)
			}
			ours = append(ours, pw)
			outputs = append(outputs, pr)
			files[i] = pw
		}
	}
	fds := make([]uintptr, 3)
	for i, f := range files {
		fds[i] = f.Fd()
	}
	child, err := r.reaper.Start(func() (int, error) {
		return syscall.ForkExec(r.path, argv, &syscall.ProcAttr{
			Dir:   "/",
			Env:   []string{DefaultPath},
			Files: fds,
		})
	})
	if err != nil {
		return nil, fmt.Errorf("runc %s: %w", cmd, execError(r.path, err))
	}
	for _, f := range ours {
		_ = f.Close()
	}
	ours = nil

	var copying sync.WaitGroup
	for i, f := range outputs {
		buf, limit := &stdout, int64(maxRuncOutput)
		if i == 1 {
			buf, limit = &stderr, maxRuncStderr
		}
		copying.Add(1)
		go func() {
			defer copying.Done()
			_, _ = io.Copy(buf, io.LimitReader(f, limit))
			// Drain the rest so runc never blocks on a full pipe.
			_, _ = io.Copy(io.Discard, f)
		}()
	}
	select {
	case <-child.Done():
	case <-ctx.Done():
		_ = child.Signal(unix.SIGKILL, false)
		<-child.Done()
		for _, f := range outputs {
			_ = f.SetReadDeadline(time.Now())
		}
		copying.Wait()
		return nil, fmt.Errorf("runc %s: %w", cmd, ctx.Err())
	}
	for _, f := range outputs {
		_ = f.SetReadDeadline(time.Now().Add(runcPipeDrain))
	}
	copying.Wait()

	exit := child.Exit()
	if exit.Status() != 0 {
		msg := lastRuncError(logPath)
		if msg == "" {
			msg = strings.TrimSpace(stderr.String())
		}
		return nil, &runcError{cmd: cmd, msg: msg, err: fmt.Errorf("exit status %d", exit.Status())}
	}
	return stdout.Bytes(), nil
}

// lastRuncError returns the last error runc logged (JSON log format).
func lastRuncError(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > runcLogTail {
		_, _ = f.Seek(fi.Size()-runcLogTail, io.SeekStart)
	}
	b, err := io.ReadAll(io.LimitReader(f, runcLogTail))
	if err != nil {
		return ""
	}
	lines := bytes.Split(b, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var entry struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal(lines[i], &entry) != nil {
			continue
		}
		if entry.Level == "error" || entry.Level == "fatal" {
			return entry.Msg
		}
	}
	return ""
}

// create runs `runc create`. stdio are the container init's fds 0-2 (for
// a terminal, /dev/null: the init gets the pty whose master arrives on
// consoleSocket).
func (r *runc) create(ctx context.Context, id, bundle, pidFile, consoleSocket string, stdio [3]*os.File) error {
	args := []string{"create", "--bundle", bundle, "--pid-file", pidFile}
	if consoleSocket != "" {
		args = append(args, "--console-socket", consoleSocket)
	}
	if r.noPivot {
		args = append(args, "--no-pivot")
	}
	_, err := r.run(ctx, runcCall{args: append(args, id), logDir: bundle, stdio: &stdio})
	return err
}

// start runs `runc start`: the init process execs the entrypoint.
func (r *runc) start(ctx context.Context, id, dir string) error {
	_, err := r.run(ctx, runcCall{args: []string{"start", id}, logDir: dir})
	return err
}

// exec runs `runc exec --detach` with the OCI process in processFile.
func (r *runc) exec(ctx context.Context, id, dir, processFile, pidFile, consoleSocket string, stdio [3]*os.File) error {
	args := []string{"exec", "--detach", "--pid-file", pidFile, "--process", processFile}
	if consoleSocket != "" {
		args = append(args, "--console-socket", consoleSocket)
	}
	_, err := r.run(ctx, runcCall{args: append(args, id), logDir: dir, stdio: &stdio})
	return err
}

// kill runs `runc kill`, with all for every process of the container.
func (r *runc) kill(ctx context.Context, id, dir string, sig unix.Signal, all bool) error {
	args := []string{"kill"}
	if all {
		args = append(args, "--all")
	}
	_, err := r.run(ctx, runcCall{args: append(args, id, strconv.Itoa(int(sig))), logDir: dir})
	return err
}

// delete runs `runc delete --force`: the agent has checked the state
// already, and force also covers a container runc has half forgotten.
func (r *runc) delete(ctx context.Context, id, dir string) error {
	_, err := r.run(ctx, runcCall{args: []string{"delete", "--force", id}, logDir: dir})
	return err
}

// pause runs `runc pause`.
func (r *runc) pause(ctx context.Context, id, dir string) error {
	_, err := r.run(ctx, runcCall{args: []string{"pause", id}, logDir: dir})
	return err
}

// resume runs `runc resume`.
func (r *runc) resume(ctx context.Context, id, dir string) error {
	_, err := r.run(ctx, runcCall{args: []string{"resume", id}, logDir: dir})
	return err
}

// update runs `runc update` with OCI LinuxResources JSON on stdin.
func (r *runc) update(ctx context.Context, id, dir string, resources []byte) error {
	_, err := r.run(ctx, runcCall{args: []string{"update", "--resources", "-", id}, logDir: dir, stdinData: resources})
	return err
}

// readPidFile reads the pid runc wrote.
func readPidFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read runc pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("runc pid file %s holds %q: %w", path, b, errdefs.ErrUnknown)
	}
	return pid, nil
}

// rootIsInitramfs reports whether / is the initial ramfs, which
// pivot_root cannot move away from.
func rootIsInitramfs() bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	fstype := ""
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options... - fstype source super
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 || f[4] != "/" {
			continue
		}
		if pf := strings.Fields(post); len(pf) > 0 {
			// The last mount on / is the one in effect.
			fstype = pf[0]
		}
	}
	return fstype == "rootfs"
}
