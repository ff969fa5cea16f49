package task

import (
	"context"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	cgroupsv2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/cocoonrt/cocoon/runtime/agent"
)

// fakeHostPID is the VMM pid the fake sandbox reports; fakeHookPID the
// pid its hooks get.
const (
	fakeHostPID = 4242
	fakeHookPID = 4343
)

// fakeLauncher boots fakeSandboxes.
type fakeLauncher struct {
	mu sync.Mutex // guards the fields below
	// launches are the requests seen.
	launches []LaunchRequest
	// sandboxes are the sandboxes booted.
	sandboxes []*fakeSandbox
	// fail makes the next Launch fail.
	fail error
	// gate, if set, holds Launch until closed.
	gate chan struct{}
	// createFail, if set, is what the booted sandboxes' CreateContainer
	// returns.
	createFail error
}

func (l *fakeLauncher) Launch(ctx context.Context, r LaunchRequest) (Sandbox, error) {
	l.mu.Lock()
	l.launches = append(l.launches, r)
	gate, fail := l.gate, l.fail
	l.fail = nil
	l.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if fail == nil && r.BeforeNetwork != nil {
		// As the sandbox does: the hooks fill the namespace before the
		// VM starts, and a failed start runs the undo.
		fail = r.BeforeNetwork(ctx, fakeHookPID)
		if fail != nil && r.UndoNetwork != nil {
			r.UndoNetwork(ctx, fakeHookPID)
		}
	}
	if fail != nil {
		return nil, fail
	}
	sb := newFakeSandbox()
	l.mu.Lock()
	sb.createFail = l.createFail
	l.sandboxes = append(l.sandboxes, sb)
	l.mu.Unlock()
	return sb, nil
}

// Restore boots a fake sandbox whose container c exists already, as a
// restore from checkpoint leaves it.
func (l *fakeLauncher) Restore(ctx context.Context, r LaunchRequest, checkpoint string, c ContainerSpec) (Sandbox, Process, error) {
	sb, err := l.Launch(ctx, r)
	if err != nil {
		return nil, nil, err
	}
	fs := sb.(*fakeSandbox)
	fs.record("restore %s from %s", c.ID, checkpoint)
	p := newFakeProcess(100, c.Stdin, c.Stdout, c.Stderr)
	fs.mu.Lock()
	fs.procs[c.ID] = p
	fs.mu.Unlock()
	return fs, p, nil
}

func (l *fakeLauncher) sandbox(i int) *fakeSandbox {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sandboxes[i]
}

func (l *fakeLauncher) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.launches)
}

// fakeSandbox is a VM whose containers are fakeProcesses.
type fakeSandbox struct {
	events chan SandboxEvent
	// dead is closed by die.
	dead chan struct{}

	mu sync.Mutex // guards the fields below
	// procs are the processes by "<container>" or "<container>/<exec>".
	procs map[string]*fakeProcess
	// calls lists the calls made, in order ("start c1", "kill c1 9 all").
	calls []string
	// stopped is set by Stop.
	stopped bool
	// startHook runs inside StartContainer (to simulate an early exit).
	startHook func(p *fakeProcess)
	// createFail, if set, fails CreateContainer.
	createFail error
	// execHook, if set, runs inside ExecProcess, which fails with its
	// error (to simulate a start that the init's exit overtakes).
	execHook func() error
}

func newFakeSandbox() *fakeSandbox {
	return &fakeSandbox{events: make(chan SandboxEvent, 8), dead: make(chan struct{}), procs: map[string]*fakeProcess{}}
}

// record logs a guest call, which takes a millisecond (see GuestTime).
func (s *fakeSandbox) record(format string, a ...any) {
	time.Sleep(time.Millisecond)
	s.mu.Lock()
	s.calls = append(s.calls, fmt.Sprintf(format, a...))
	s.mu.Unlock()
}

// GuestTime counts each guest call as the millisecond it took.
func (s *fakeSandbox) GuestTime() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Duration(len(s.calls)) * time.Millisecond
}

func (s *fakeSandbox) callLog() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

func (s *fakeSandbox) proc(key string) *fakeProcess {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[key]
}

func (s *fakeSandbox) HostPID() uint32 { return fakeHostPID }

func (s *fakeSandbox) HookPID() int { return fakeHookPID }

func (s *fakeSandbox) CreateContainer(ctx context.Context, c ContainerSpec) (Process, error) {
	s.record("create %s", c.ID)
	if s.createFail != nil {
		return nil, s.createFail
	}
	p := newFakeProcess(100, c.Stdin, c.Stdout, c.Stderr)
	s.mu.Lock()
	s.procs[c.ID] = p
	s.mu.Unlock()
	return p, nil
}

func (s *fakeSandbox) StartContainer(ctx context.Context, id string) error {
	s.record("start %s", id)
	p := s.proc(id)
	if p == nil {
		return errdefs.ErrNotFound
	}
	s.mu.Lock()
	hook := s.startHook
	s.mu.Unlock()
	if hook != nil {
		hook(p)
	}
	return nil
}

func (s *fakeSandbox) ExecProcess(ctx context.Context, containerID, execID string, sp *specs.Process, stdin io.Reader, stdout, stderr io.Writer) (Process, error) {
	s.record("exec %s %s %v", containerID, execID, sp.Args)
	s.mu.Lock()
	hook := s.execHook
	s.mu.Unlock()
	if hook != nil {
		if err := hook(); err != nil {
			return nil, err
		}
	}
	p := newFakeProcess(200, stdin, stdout, stderr)
	s.mu.Lock()
	s.procs[containerID+"/"+execID] = p
	s.mu.Unlock()
	return p, nil
}

func (s *fakeSandbox) KillContainer(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	s.record("kill %s %d %v", id, sig, all)
	if p := s.proc(id); p != nil && (sig == syscall.SIGKILL || sig == syscall.SIGTERM) {
		p.exit(128 + uint32(sig))
	}
	if all {
		s.mu.Lock()
		var execs []*fakeProcess
		for k, p := range s.procs {
			if len(k) > len(id) && k[:len(id)+1] == id+"/" {
				execs = append(execs, p)
			}
		}
		s.mu.Unlock()
		for _, p := range execs {
			p.exit(128 + uint32(sig))
		}
	}
	return nil
}

func (s *fakeSandbox) DeleteContainer(ctx context.Context, id string) error {
	s.record("delete %s", id)
	if p := s.proc(id); p != nil {
		p.exit(137)
	}
	return nil
}

func (s *fakeSandbox) FlushContainer(ctx context.Context, id string) error {
	s.record("flush %s", id)
	return nil
}

func (s *fakeSandbox) PauseContainer(ctx context.Context, id string) error {
	s.record("pause %s", id)
	return nil
}

func (s *fakeSandbox) ResumeContainer(ctx context.Context, id string) error {
	s.record("resume %s", id)
	return nil
}

func (s *fakeSandbox) UpdateContainer(ctx context.Context, id string, r *specs.LinuxResources) error {
	var mem int64
	if r.Memory != nil && r.Memory.Limit != nil {
		mem = *r.Memory.Limit
	}
	s.record("update %s memory=%d", id, mem)
	return nil
}

func (s *fakeSandbox) ContainerStats(ctx context.Context, id string) (*cgroupsv2stats.Metrics, error) {
	return &cgroupsv2stats.Metrics{Pids: &cgroupsv2stats.PidsStat{Current: 3}}, nil
}

func (s *fakeSandbox) ContainerPids(ctx context.Context, id string) ([]uint32, error) {
	return []uint32{1, 7}, nil
}

func (s *fakeSandbox) Events() <-chan SandboxEvent { return s.events }

func (s *fakeSandbox) Checkpoint(ctx context.Context, r CheckpointRequest) error {
	s.record("checkpoint %s to %s exit=%v paused=%v ns=%s", r.ContainerID, r.Dir, r.Exit, r.Paused, r.Namespace)
	return nil
}

// Dead is closed by die.
func (s *fakeSandbox) Dead() <-chan struct{} { return s.dead }

// die ends the fake VM on its own: every process is lost.
func (s *fakeSandbox) die() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.dead)
	for _, p := range s.procs {
		p.lose()
	}
}

func (s *fakeSandbox) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped {
		s.stopped = true
		s.calls = append(s.calls, "stop")
		close(s.events)
	}
	return nil
}

func (s *fakeSandbox) isStopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// fakeProcess is a guest process that ends when the test says so.
type fakeProcess struct {
	pid            uint32
	stdin          io.Reader
	stdout, stderr io.Writer

	once sync.Once // closes done
	// done is closed when the process ended; status, or lost, is then
	// set.
	done   chan struct{}
	status agent.ExitStatus
	lost   bool

	mu sync.Mutex // guards signals and stdinClosed
	// signals are the signals sent with Signal.
	signals     []syscall.Signal
	stdinClosed bool
}

func newFakeProcess(pid uint32, stdin io.Reader, stdout, stderr io.Writer) *fakeProcess {
	return &fakeProcess{pid: pid, stdin: stdin, stdout: stdout, stderr: stderr, done: make(chan struct{})}
}

// exit ends the process with code (once).
func (p *fakeProcess) exit(code uint32) { p.exitStatus(agent.ExitStatus{Code: code}) }

// exitStatus ends the process with st (once).
func (p *fakeProcess) exitStatus(st agent.ExitStatus) {
	p.once.Do(func() {
		st.ExitedAt = time.Now()
		p.status = st
		close(p.done)
	})
}

// lose makes Wait fail, as when the agent session is gone.
func (p *fakeProcess) lose() {
	p.once.Do(func() {
		p.lost = true
		close(p.done)
	})
}

func (p *fakeProcess) Pid() uint32 { return p.pid }

func (p *fakeProcess) Wait(ctx context.Context) (agent.ExitStatus, error) {
	select {
	case <-p.done:
		if p.lost {
			return agent.ExitStatus{}, fmt.Errorf("wait for process: agent connection closed: %w", errdefs.ErrUnavailable)
		}
		return p.status, nil
	case <-ctx.Done():
		return agent.ExitStatus{}, ctx.Err()
	}
}

func (p *fakeProcess) Signal(ctx context.Context, sig syscall.Signal, group bool) error {
	p.mu.Lock()
	p.signals = append(p.signals, sig)
	p.mu.Unlock()
	if sig == syscall.SIGKILL {
		p.exit(137)
	}
	return nil
}

func (p *fakeProcess) CloseStdin(ctx context.Context) error {
	p.mu.Lock()
	p.stdinClosed = true
	p.mu.Unlock()
	return nil
}

func (p *fakeProcess) Resize(ctx context.Context, w, h uint32) error { return nil }

// recorder is a Publisher that keeps the events.
type recorder struct {
	mu sync.Mutex // guards events
	// events are the published events, in order.
	events []published
}

type published struct {
	topic string
	event proto.Message
}

func (r *recorder) Publish(ctx context.Context, topic string, event proto.Message) {
	r.mu.Lock()
	r.events = append(r.events, published{topic, event})
	r.mu.Unlock()
}

func (r *recorder) topics() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.events))
	for i, e := range r.events {
		out[i] = e.topic
	}
	return out
}

func (r *recorder) find(topic string) []proto.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []proto.Message
	for _, e := range r.events {
		if e.topic == topic {
			out = append(out, e.event)
		}
	}
	return out
}
