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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/agent/reaper"
	"github.com/cocoonrt/cocoon/guest/initd"
)

// Bounds on what a runtime call returns to the agent.
const (
	maxOCIStderr = 64 << 10
	// ociLogTail is how much of a call's log is searched for its error.
	ociLogTail = 64 << 10
	// ociPipeDrain bounds the wait for a finished runtime's output pipes,
	// which a process it left behind could hold open.
	ociPipeDrain = 2 * time.Second
)

// ociRuntime drives an OCI runtime through the command line that runc
// defined and crun follows (create, start, exec --detach, kill, delete,
// pause, resume, update; --root, --log, --log-format json). The guest
// image ships crun: under emulation a C runtime starts a container in a
// third of the time the Go runtime of runc needs, and either binary works.
//
// It is a small wrapper of its own rather than containerd's go-runc
// because every runtime process must be started through the agent's
// reaper (the only waiter for children of PID 1): go-runc runs exec.Cmd,
// whose Wait races the reaper, behind a package-level monitor.
type ociRuntime struct {
	// path is the runtime binary; its base name prefixes errors.
	path string
	// root is the runtime's state directory (--root).
	root string
	// noPivot passes --no-pivot to create: the runtime enters the
	// container root with MS_MOVE and chroot, not pivot_root.
	noPivot bool
	// reaper starts every runtime process and collects its exit.
	reaper *reaper.Reaper
	// seq numbers the calls' log files.
	seq atomic.Uint64
}

// ociCall is one invocation of the runtime.
type ociCall struct {
	// args follow the runtime's global flags.
	args []string
	// logDir receives the call's log file (removed afterwards).
	logDir string
	// stdio, if set, are the runtime's fds 0-2, which it hands on to the
	// container process it starts. Otherwise stdin and stdout are
	// /dev/null, and stderr is kept for the error message.
	stdio *[3]*os.File
}

// ociError is a failed runtime call.
type ociError struct {
	// cmd is the runtime and its command ("crun create").
	cmd string
	// msg is the error the runtime logged, or its stderr.
	msg string
	// err is how the call failed (the runtime's exit status).
	err error
}

func (e *ociError) Error() string {
	if e.msg == "" {
		return fmt.Sprintf("%s: %v", e.cmd, e.err)
	}
	return fmt.Sprintf("%s: %s", e.cmd, e.msg)
}

func (e *ociError) Unwrap() error { return e.err }

// run runs one runtime command. A cancelled ctx kills the runtime.
func (r *ociRuntime) run(ctx context.Context, c ociCall) error {
	cmd := filepath.Base(r.path) + " " + c.args[0]
	logPath := filepath.Join(c.logDir, fmt.Sprintf("oci-%d.log", r.seq.Add(1)))
	defer os.Remove(logPath)
	argv := append([]string{r.path, "--root", r.root, "--log", logPath, "--log-format", "json"}, c.args...)

	var (
		files  [3]*os.File
		ours   []*os.File // the child's ends, closed once it runs
		errOut *os.File   // our read end of its stderr
		stderr bytes.Buffer
	)
	defer func() {
		for _, f := range ours {
			_ = f.Close()
		}
		if errOut != nil {
			_ = errOut.Close()
		}
	}()
	if c.stdio != nil {
		files = *c.stdio
	} else {
		null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		pr, pw, err := os.Pipe()
		if err != nil {
			_ = null.Close()
			return fmt.Errorf("%s: stderr pipe: %w", cmd, err)
		}
		ours = append(ours, null, pw)
		errOut = pr
		files = [3]*os.File{null, null, pw}
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
		return fmt.Errorf("%s: %w", cmd, execError(r.path, err))
	}
	for _, f := range ours {
		_ = f.Close()
	}
	ours = nil

	copied := make(chan struct{})
	if errOut != nil {
		go func() {
			defer close(copied)
			_, _ = io.Copy(&stderr, io.LimitReader(errOut, maxOCIStderr))
			// Drain the rest so the runtime never blocks on a full pipe.
			_, _ = io.Copy(io.Discard, errOut)
		}()
	} else {
		close(copied)
	}
	drain := func(within time.Duration) {
		if errOut != nil {
			_ = errOut.SetReadDeadline(time.Now().Add(within))
		}
		<-copied
	}
	select {
	case <-child.Done():
	case <-ctx.Done():
		_ = child.Signal(unix.SIGKILL, false)
		<-child.Done()
		drain(0)
		return fmt.Errorf("%s: %w", cmd, ctx.Err())
	}
	drain(ociPipeDrain)

	exit := child.Exit()
	if exit.Status() != 0 {
		msg := lastOCIError(logPath)
		if msg == "" {
			msg = strings.TrimSpace(stderr.String())
		}
		return &ociError{cmd: cmd, msg: msg, err: fmt.Errorf("exit status %d", exit.Status())}
	}
	return nil
}

// lastOCIError returns the last error the runtime logged (JSON log
// format, the same in runc and crun).
func lastOCIError(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > ociLogTail {
		_, _ = f.Seek(fi.Size()-ociLogTail, io.SeekStart)
	}
	b, err := io.ReadAll(io.LimitReader(f, ociLogTail))
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

// create runs `create`. stdio are the container init's fds 0-2 (for
// a terminal, /dev/null: the init gets the pty whose master arrives on
// consoleSocket).
func (r *ociRuntime) create(ctx context.Context, id, bundle, pidFile, consoleSocket string, stdio [3]*os.File) error {
	args := []string{"create", "--bundle", bundle, "--pid-file", pidFile}
	if consoleSocket != "" {
		args = append(args, "--console-socket", consoleSocket)
	}
	if r.noPivot {
		args = append(args, "--no-pivot")
	}
	return r.run(ctx, ociCall{args: append(args, id), logDir: bundle, stdio: &stdio})
}

// start runs `start`: the init process execs the entrypoint.
func (r *ociRuntime) start(ctx context.Context, id, dir string) error {
	return r.run(ctx, ociCall{args: []string{"start", id}, logDir: dir})
}

// exec runs `exec --detach` with the OCI process in processFile.
func (r *ociRuntime) exec(ctx context.Context, id, dir, processFile, pidFile, consoleSocket string, stdio [3]*os.File) error {
	args := []string{"exec", "--detach", "--pid-file", pidFile, "--process", processFile}
	if consoleSocket != "" {
		args = append(args, "--console-socket", consoleSocket)
	}
	return r.run(ctx, ociCall{args: append(args, id), logDir: dir, stdio: &stdio})
}

// kill runs `kill`, with all for every process of the container.
func (r *ociRuntime) kill(ctx context.Context, id, dir string, sig unix.Signal, all bool) error {
	args := []string{"kill"}
	if all {
		args = append(args, "--all")
	}
	return r.run(ctx, ociCall{args: append(args, id, strconv.Itoa(int(sig))), logDir: dir})
}

// delete runs `delete --force`: the agent has checked the state already,
// and force also covers a container the runtime has half forgotten.
func (r *ociRuntime) delete(ctx context.Context, id, dir string) error {
	return r.run(ctx, ociCall{args: []string{"delete", "--force", id}, logDir: dir})
}

// pause runs `pause`.
func (r *ociRuntime) pause(ctx context.Context, id, dir string) error {
	return r.run(ctx, ociCall{args: []string{"pause", id}, logDir: dir})
}

// resume runs `resume`.
func (r *ociRuntime) resume(ctx context.Context, id, dir string) error {
	return r.run(ctx, ociCall{args: []string{"resume", id}, logDir: dir})
}

// update runs `update` with OCI LinuxResources JSON, passed in a file in
// dir: crun, unlike runc, does not read "-" as stdin.
func (r *ociRuntime) update(ctx context.Context, id, dir string, resources []byte) error {
	f, err := os.CreateTemp(dir, "resources-*.json")
	if err != nil {
		return fmt.Errorf("%s update: %w", filepath.Base(r.path), err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(resources)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s update: %w", filepath.Base(r.path), err)
	}
	return r.run(ctx, ociCall{args: []string{"update", "--resources", f.Name(), id}, logDir: dir})
}

// readPidFile reads the pid the runtime wrote.
func readPidFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read runtime pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("runtime pid file %s holds %q: %w", path, b, errdefs.ErrUnknown)
	}
	return pid, nil
}

// rootCannotPivot reports whether / is the kernel's rootfs itself, which
// pivot_root cannot move away from. As PID 1 the agent first puts a
// mount over it (initd), and then it can.
func rootCannotPivot() bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	return err == nil && initd.RootIsKernelRootfs(b)
}
