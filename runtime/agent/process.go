package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/guest/api"
)

// copyBufSize bounds each stdio read.
const copyBufSize = 32 << 10

// ProcessSpec describes a process to start in the guest.
type ProcessSpec struct {
	// ID names the process in the agent: [A-Za-z0-9._-]{1,64}, unique
	// among the guest's processes until it has been waited for.
	ID string
	// Args is the command line; Args[0] is resolved through Env's PATH
	// when it has no slash.
	Args []string
	// Env as KEY=VALUE; a default PATH is added when absent.
	Env []string
	// Cwd defaults to /.
	Cwd string
	// Terminal runs the process on a new pty; its output arrives on
	// Stdout and Stderr must be nil.
	Terminal bool
	// UID and GID the process runs as.
	UID, GID uint32
	// Stdin, if set, is copied to the process until it returns EOF (then
	// the process reads EOF) or CloseStdin is called. Reading it is not
	// interruptible: the copy may stay blocked in Read after the process
	// is gone until the caller closes it.
	Stdin io.Reader
	// Stdout and Stderr, if set, receive the process's output; otherwise
	// it goes to /dev/null. They are written by one goroutine each.
	Stdout, Stderr io.Writer
	// Width and Height are the initial terminal size.
	Width, Height uint32
}

// ExitStatus says how a process ended.
type ExitStatus struct {
	// Code is the exit code, or 128 plus the signal that ended the
	// process (137 for SIGKILL), as runc reports it.
	Code uint32
	// Signal is the signal that ended the process, 0 if it exited.
	Signal syscall.Signal
	// ExitedAt is the guest's wall clock at the exit.
	ExitedAt time.Time
	// OOMKills is, for a container's init, the container's count of OOM
	// kills at the exit; 0 for other processes.
	OOMKills uint64
}

// Process is a process started in the guest.
type Process struct {
	c   *Client
	id  string
	pid uint32

	stdin net.Conn // nil without Stdin
	// outputs are the stdout/stderr streams; closed once copied.
	outputs []net.Conn
	// outputDone is closed once stdout and stderr were copied to EOF.
	outputDone chan struct{}

	// stdinSem serializes writes to the stdin stream with its close, so
	// that no data follows the FIN; a channel so CloseStdin can give up
	// with its context.
	stdinSem chan struct{}
	// stdinClosed is guarded by stdinSem.
	stdinClosed bool
	// stdinReadSince is when the stdin copy's pending Read of the
	// caller's reader began (unix ns), 0 while it is not in Read.
	stdinReadSince atomic.Int64
	// stdinCopied is closed when the stdin copy has ended.
	stdinCopied chan struct{}

	// waitSem serializes Wait calls; a channel so each can give up with
	// its context.
	waitSem chan struct{}
	// status is the agent's answer to WaitProcess, guarded by waitSem;
	// kept because the agent forgets the process once it answered.
	status *ExitStatus
	// waitAsked is set once WaitProcess has been called: from then on
	// the agent may have forgotten the process (see CloseStdin).
	waitAsked atomic.Bool
}

// Start opens the process's stdio streams and starts it. On error nothing
// is left running in the guest.
func (c *Client) Start(ctx context.Context, spec ProcessSpec) (*Process, error) {
	op := fmt.Sprintf("start process %s", spec.ID)
	if len(spec.Args) == 0 {
		return nil, fmt.Errorf("%s: no program to run: %w", op, errdefs.ErrInvalidArgument)
	}
	if spec.Terminal && spec.Stderr != nil {
		return nil, fmt.Errorf("%s: a terminal has no separate stderr: %w", op, errdefs.ErrInvalidArgument)
	}
	req := &api.StartProcessRequest{
		Id:       spec.ID,
		Args:     spec.Args,
		Env:      spec.Env,
		Cwd:      spec.Cwd,
		Terminal: spec.Terminal,
		Uid:      spec.UID,
		Gid:      spec.GID,
		Stdin:    spec.Stdin != nil,
		Stdout:   spec.Stdout != nil,
		Stderr:   spec.Stderr != nil,
		Width:    spec.Width,
		Height:   spec.Height,
	}
	return c.startWithStdio(ctx, op, spec.ID, spec.Stdin, spec.Stdout, spec.Stderr, func(ctx context.Context) (uint32, error) {
		resp, err := c.agent.StartProcess(ctx, req)
		if err != nil {
			return 0, err
		}
		return resp.Pid, nil
	})
}

// copyOutput copies one output stream to w. If w fails, the rest is
// discarded rather than left to block the process in the guest.
func copyOutput(ctx context.Context, w io.Writer, s net.Conn, id string, kind api.StreamKind) {
	defer s.Close()
	buf := make([]byte, copyBufSize)
	for {
		n, err := s.Read(buf)
		if n > 0 && w != io.Discard {
			if _, werr := w.Write(buf[:n]); werr != nil {
				log.G(ctx).WithError(werr).WithField("process", id).WithField("stream", kind.String()).Warn("output writer failed; discarding the rest")
				w = io.Discard
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Process) copyStdin(r io.Reader) {
	defer close(p.stdinCopied)
	buf := make([]byte, copyBufSize)
	for {
		p.stdinReadSince.Store(time.Now().UnixNano())
		n, err := r.Read(buf)
		p.stdinReadSince.Store(0)
		if n > 0 {
			p.stdinSem <- struct{}{}
			closed := p.stdinClosed
			var werr error
			if !closed {
				if _, werr = p.stdin.Write(buf[:n]); werr != nil {
					p.closeStdinLocked()
				}
			}
			<-p.stdinSem
			if closed || werr != nil {
				return
			}
		}
		if err != nil {
			// EOF from the caller: the process reads EOF too.
			p.stdinSem <- struct{}{}
			p.closeStdinLocked()
			<-p.stdinSem
			return
		}
	}
}

// closeStdinLocked half-closes the stdin stream; the caller holds stdinSem.
func (p *Process) closeStdinLocked() {
	if !p.stdinClosed && p.stdin != nil {
		_ = p.stdin.Close()
	}
	p.stdinClosed = true
}

// ID is the process's id in the agent.
func (p *Process) ID() string { return p.id }

// Pid is the process's pid in the guest.
func (p *Process) Pid() uint32 { return p.pid }

// stdinIdle is how long the stdin copy must have been waiting in Read
// for CloseStdin to conclude that it holds no data. Read returning and the
// copy taking the data over cannot be observed as one step, so "blocked in
// Read for a while" is the sign that everything read so far was sent.
const stdinIdle = 20 * time.Millisecond

// CloseStdin makes the process read EOF once the stdin already read from
// ProcessSpec.Stdin is delivered. It waits, within ctx, for the copy to
// reach the end of Stdin, to go idle in Read, or to finish a write the
// process is slow to take. A process that has exited and been waited for
// has no stdin left to close: that is not an error (the agent forgets a
// process as it answers WaitProcess, which may be before the host has
// read the answer).
func (p *Process) CloseStdin(ctx context.Context) error {
	if p.stdin != nil {
		if err := p.waitStdinIdle(ctx); err != nil {
			return err
		}
	}
	select {
	case p.stdinSem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("close stdin of process %s: %w", p.id, ctx.Err())
	}
	p.closeStdinLocked()
	<-p.stdinSem
	// The FIN is on the wire before this call, so the agent has all the
	// data when it acts.
	_, err := p.c.agent.CloseStdin(ctx, &api.CloseStdinRequest{Id: p.id})
	err = p.c.mapErr(fmt.Sprintf("close stdin of process %s", p.id), err)
	if errdefs.IsNotFound(err) && p.waitAsked.Load() {
		return nil
	}
	return err
}

func (p *Process) waitStdinIdle(ctx context.Context) error {
	tick := time.NewTicker(stdinIdle / 4)
	defer tick.Stop()
	for {
		if since := p.stdinReadSince.Load(); since != 0 && time.Since(time.Unix(0, since)) >= stdinIdle {
			return nil
		}
		select {
		case <-p.stdinCopied:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("close stdin of process %s: %w", p.id, ctx.Err())
		case <-tick.C:
		}
	}
}

// Signal sends sig to the process, or with group to its process group.
func (p *Process) Signal(ctx context.Context, sig syscall.Signal, group bool) error {
	if sig <= 0 {
		return fmt.Errorf("signal %d: %w", sig, errdefs.ErrInvalidArgument)
	}
	_, err := p.c.agent.SignalProcess(ctx, &api.SignalProcessRequest{Id: p.id, Signal: uint32(sig), Group: group})
	return p.c.mapErr(fmt.Sprintf("signal process %s", p.id), err)
}

// Resize sets the size of the process's terminal.
func (p *Process) Resize(ctx context.Context, width, height uint32) error {
	_, err := p.c.agent.ResizePty(ctx, &api.ResizePtyRequest{Id: p.id, Width: width, Height: height})
	return p.c.mapErr(fmt.Sprintf("resize terminal of process %s", p.id), err)
}

// Wait returns how the process ended, once it has and its stdout and
// stderr were copied to the caller's writers in full. It may be called
// more than once.
func (p *Process) Wait(ctx context.Context) (ExitStatus, error) {
	select {
	case p.waitSem <- struct{}{}:
	case <-ctx.Done():
		return ExitStatus{}, fmt.Errorf("wait for process %s: %w", p.id, ctx.Err())
	}
	defer func() { <-p.waitSem }()
	if p.status == nil {
		p.waitAsked.Store(true)
		resp, err := p.c.agent.WaitProcess(ctx, &api.WaitProcessRequest{Id: p.id})
		if err != nil {
			return ExitStatus{}, p.c.mapErr(fmt.Sprintf("wait for process %s", p.id), err)
		}
		p.status = &ExitStatus{
			Code:     resp.ExitStatus,
			Signal:   syscall.Signal(resp.Signal),
			ExitedAt: time.Unix(0, resp.ExitedAtUnixNs),
			OOMKills: resp.OomKills,
		}
	}
	// The agent closed the output streams before it answered; what is
	// left is in flight or in the caller's writers.
	select {
	case <-p.outputDone:
	case <-ctx.Done():
		return ExitStatus{}, fmt.Errorf("copy output of process %s: %w", p.id, ctx.Err())
	case <-p.c.Done():
		// The session died after the agent answered: the output that
		// was in flight is lost, but the status is known.
	}
	p.releaseStdin()
	return *p.status, nil
}

// releaseStdin closes the stdin stream of a finished process, so that a
// copy blocked on a full window ends.
func (p *Process) releaseStdin() {
	if p.stdin == nil {
		return
	}
	_ = p.stdin.SetWriteDeadline(time.Now())
	select {
	case p.stdinSem <- struct{}{}:
		p.closeStdinLocked()
		<-p.stdinSem
	default:
		// A write in progress fails on the deadline; closing here could
		// race it, and the session drops the stream anyway.
	}
}
