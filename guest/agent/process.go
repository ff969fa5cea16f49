//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/agent/reaper"
	"github.com/cocoonrt/cocoon/guest/api"
)

// Bounds on a process's command line and environment: Linux's own
// ARG_MAX-like limits, checked before any resource is taken.
const (
	maxArgs      = 4096
	maxEnv       = 4096
	maxArgvBytes = 1 << 20
	maxPath      = 4096
	maxSignal    = 64 // _NSIG - 1
)

// DefaultPath is the PATH a process gets when its environment has none;
// the same as runc's.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// process is one process started by the service. Its lifecycle: reserved
// (a nil entry in Service.procs) → running → exited (status final, output
// drained: exited is closed) → forgotten (waited for; removed, streams
// released).
type process struct {
	id    string
	child *reaper.Child
	stdio *stdio
	// exited is closed once result is set.
	exited chan struct{}
	// result is written once, before exited is closed.
	result *api.WaitProcessResponse
	// release frees the stdio once the status was collected.
	release sync.Once
	// onExit, if set, learns of the exit as soon as the process is
	// reaped, before its output is drained (a container's init marks
	// the container stopped).
	onExit func(reaper.Exit)
	// oomKills, if set, counts the OOM kills of the process's container;
	// its value at the exit goes with the exit status (inits only).
	oomKills func() uint64
}

// StartProcess starts a process once the stdio streams it names arrived.
func (s *Service) StartProcess(ctx context.Context, req *api.StartProcessRequest) (_ *api.StartProcessResponse, retErr error) {
	if err := validateStart(req); err != nil {
		return nil, err
	}
	if err := s.reserve(req.Id); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			s.unreserve(req.Id)
		}
	}()

	var want []api.StreamKind
	if req.Stdin {
		want = append(want, api.StreamStdin)
	}
	if req.Stdout {
		want = append(want, api.StreamStdout)
	}
	if req.Stderr {
		want = append(want, api.StreamStderr)
	}
	streams, err := s.streams.claim(ctx, req.Id, want, s.cfg.StreamTimeout)
	if err != nil {
		return nil, err
	}
	pio, err := newStdio(req, streams, s.stdioTimes())
	if err != nil {
		streams.closeAll()
		return nil, err
	}
	child, err := s.spawn(req, pio)
	pio.closeChild()
	if err != nil {
		pio.closeFiles()
		streams.closeAll()
		// The host names the process in its own error.
		return nil, err
	}
	p := &process{id: req.Id, child: child, stdio: pio, exited: make(chan struct{})}
	pio.start(ctx)
	go s.watch(ctx, p)

	s.mu.Lock()
	s.procs[req.Id] = p
	s.mu.Unlock()
	log.G(ctx).WithField("process", req.Id).WithField("pid", child.Pid()).Debug("process started")
	return &api.StartProcessResponse{Pid: uint32(child.Pid())}, nil
}

func validateStart(req *api.StartProcessRequest) error {
	if err := api.ValidID(req.Id); err != nil {
		return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	if len(req.Args) == 0 || req.Args[0] == "" {
		return fmt.Errorf("process %s: no program to run: %w", req.Id, errdefs.ErrInvalidArgument)
	}
	if len(req.Args) > maxArgs || len(req.Env) > maxEnv {
		return fmt.Errorf("process %s: %d args and %d env entries, at most %d and %d: %w",
			req.Id, len(req.Args), len(req.Env), maxArgs, maxEnv, errdefs.ErrInvalidArgument)
	}
	size := 0
	for _, list := range [][]string{req.Args, req.Env} {
		for _, a := range list {
			if strings.IndexByte(a, 0) >= 0 {
				return fmt.Errorf("process %s: argument or environment entry holds a NUL byte: %w", req.Id, errdefs.ErrInvalidArgument)
			}
			size += len(a) + 1
		}
	}
	if size > maxArgvBytes {
		return fmt.Errorf("process %s: args and env take %d bytes, at most %d: %w", req.Id, size, maxArgvBytes, errdefs.ErrInvalidArgument)
	}
	if len(req.Cwd) > maxPath || strings.IndexByte(req.Cwd, 0) >= 0 || (req.Cwd != "" && !filepath.IsAbs(req.Cwd)) {
		return fmt.Errorf("process %s: cwd %q must be an absolute path: %w", req.Id, req.Cwd, errdefs.ErrInvalidArgument)
	}
	if req.Terminal && req.Stderr {
		return fmt.Errorf("process %s: a terminal has no separate stderr stream: %w", req.Id, errdefs.ErrInvalidArgument)
	}
	if req.Width > maxWinsize || req.Height > maxWinsize {
		return fmt.Errorf("process %s: terminal size %dx%d over %d: %w", req.Id, req.Width, req.Height, maxWinsize, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (s *Service) reserve(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.procs[id]; ok {
		return fmt.Errorf("process %s: %w", id, errdefs.ErrAlreadyExists)
	}
	if len(s.procs) >= s.cfg.MaxProcesses {
		return fmt.Errorf("%d processes known to the agent (wait for finished ones): %w", len(s.procs), errdefs.ErrResourceExhausted)
	}
	s.procs[id] = nil
	return nil
}

func (s *Service) unreserve(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.procs[id]; ok && p == nil {
		delete(s.procs, id)
	}
}

// spawn forks and execs the process in its own session (so its process
// group can be signalled as one) with the given stdio.
func (s *Service) spawn(req *api.StartProcessRequest, pio *stdio) (*reaper.Child, error) {
	env := withDefaultPath(req.Env)
	path, err := lookPath(req.Args[0], env)
	if err != nil {
		return nil, err
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/"
	}
	sys := &syscall.SysProcAttr{Setsid: true}
	if req.Terminal {
		sys.Setctty = true
		sys.Ctty = 0
	}
	if int(req.Uid) != os.Getuid() || int(req.Gid) != os.Getgid() {
		// No supplementary groups: the process is exactly uid:gid.
		sys.Credential = &syscall.Credential{Uid: req.Uid, Gid: req.Gid, Groups: []uint32{}}
	}
	attr := &syscall.ProcAttr{Dir: cwd, Env: env, Files: pio.childFds(), Sys: sys}
	child, err := s.cfg.Reaper.Start(func() (int, error) {
		return syscall.ForkExec(path, req.Args, attr)
	})
	if err != nil {
		return nil, execError(req.Args[0], err)
	}
	return child, nil
}

func execError(prog string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("exec %q: %w: %w", prog, err, errdefs.ErrNotFound)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("exec %q: %w: %w", prog, err, errdefs.ErrPermissionDenied)
	case errors.Is(err, unix.ENOEXEC), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EINVAL):
		return fmt.Errorf("exec %q: %w: %w", prog, err, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ENOMEM):
		return fmt.Errorf("exec %q: %w: %w", prog, err, errdefs.ErrResourceExhausted)
	}
	return fmt.Errorf("exec %q: %w", prog, err)
}

func withDefaultPath(env []string) []string {
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			return env
		}
	}
	out := make([]string, 0, len(env)+1)
	out = append(out, env...)
	return append(out, DefaultPath)
}

// lookPath resolves prog through the PATH of the process's environment
// (not the agent's), as execvp in the process would.
func lookPath(prog string, env []string) (string, error) {
	if strings.Contains(prog, "/") {
		return prog, nil
	}
	var pathList string
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			pathList = v
		}
	}
	for _, dir := range filepath.SplitList(pathList) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, prog)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec %q: executable file not found in $PATH: %w", prog, errdefs.ErrNotFound)
}

// watch publishes the exit once the output is drained.
func (s *Service) watch(ctx context.Context, p *process) {
	<-p.child.Done()
	exit := p.child.Exit()
	if p.onExit != nil {
		p.onExit(exit)
	}
	p.stdio.processExited()
	p.result = &api.WaitProcessResponse{
		ExitStatus:     exit.Status(),
		Signal:         uint32(exit.Signal()),
		ExitedAtUnixNs: exit.At.UnixNano(),
	}
	if p.oomKills != nil {
		p.result.OomKills = p.oomKills()
	}
	close(p.exited)
	log.G(ctx).WithField("process", p.id).WithField("exit_status", exit.Status()).Debug("process exited")
}

// lookup returns a started process.
func (s *Service) lookup(id string) (*process, error) {
	if err := api.ValidID(id); err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	s.mu.Lock()
	p, ok := s.procs[id]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("process %s: %w", id, errdefs.ErrNotFound)
	}
	if p == nil {
		return nil, fmt.Errorf("process %s is still starting: %w", id, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

// WaitProcess returns the exit status once the process exited and its
// output was written; the process is then forgotten.
func (s *Service) WaitProcess(ctx context.Context, req *api.WaitProcessRequest) (*api.WaitProcessResponse, error) {
	p, err := s.lookup(req.Id)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
	}
	if err := ctx.Err(); err != nil {
		// The caller is gone (its session too, maybe: ttrpc cancels
		// the calls of a control stream that ends): the status stays
		// for the next WaitProcess, from whichever session, even if the
		// exit came at the same time.
		return nil, fmt.Errorf("wait for process %s: %w", req.Id, err)
	}
	s.forget(p)
	return p.result, nil
}

// AttachProcess hands the stdio of a running process, or of one that has
// exited and not been waited for, to the streams the host opens for it
// (in the calling session, as for StartProcess); the kinds not asked for
// are detached. Its copiers go on with the new streams, first with what
// they held since their old session ended.
func (s *Service) AttachProcess(ctx context.Context, req *api.AttachProcessRequest) (*api.StartProcessResponse, error) {
	p, err := s.lookup(req.Id)
	if err != nil {
		return nil, err
	}
	want, err := p.stdio.wantedStreams(req.Stdin, req.Stdout, req.Stderr)
	if err != nil {
		return nil, err
	}
	streams, err := s.streams.claim(ctx, req.Id, want, s.cfg.StreamTimeout)
	if err != nil {
		return nil, err
	}
	if err := p.stdio.attach(streams); err != nil {
		streams.closeAll()
		return nil, fmt.Errorf("process %s was waited for meanwhile: %w", req.Id, errdefs.ErrNotFound)
	}
	log.G(ctx).WithField("process", req.Id).WithField("stdin", req.Stdin).WithField("stdout", req.Stdout).
		WithField("stderr", req.Stderr).Debug("process attached")
	return &api.StartProcessResponse{Pid: uint32(p.child.Pid())}, nil
}

func (s *Service) forget(p *process) {
	s.mu.Lock()
	if s.procs[p.id] == p {
		delete(s.procs, p.id)
	}
	s.mu.Unlock()
	p.release.Do(p.stdio.release)
}

// SignalProcess signals a process, or its process group.
func (s *Service) SignalProcess(ctx context.Context, req *api.SignalProcessRequest) (*api.Empty, error) {
	if req.Signal == 0 || req.Signal > maxSignal {
		return nil, fmt.Errorf("signal %d: %w", req.Signal, errdefs.ErrInvalidArgument)
	}
	p, err := s.lookup(req.Id)
	if err != nil {
		return nil, err
	}
	if err := p.child.Signal(unix.Signal(req.Signal), req.Group); err != nil {
		return nil, fmt.Errorf("process %s: %w", req.Id, err)
	}
	return &api.Empty{}, nil
}

// CloseStdin closes the process's stdin once what the host sent is
// delivered.
func (s *Service) CloseStdin(ctx context.Context, req *api.CloseStdinRequest) (*api.Empty, error) {
	p, err := s.lookup(req.Id)
	if err != nil {
		return nil, err
	}
	if err := p.stdio.closeStdin(); err != nil {
		return nil, fmt.Errorf("close stdin of process %s: %w", req.Id, err)
	}
	return &api.Empty{}, nil
}

// ResizePty sets the window size of the process's terminal.
func (s *Service) ResizePty(ctx context.Context, req *api.ResizePtyRequest) (*api.Empty, error) {
	p, err := s.lookup(req.Id)
	if err != nil {
		return nil, err
	}
	if err := p.stdio.resize(req.Width, req.Height); err != nil {
		return nil, err
	}
	return &api.Empty{}, nil
}
