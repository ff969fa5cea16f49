// Package task implements containerd's Task service for the containers of
// one sandbox (one VM): the shim serves it over ttrpc as both task API v2
// (containerd 1.6, 1.7) and v3 (containerd 2.x).
//
// Methods stay thin: look up, check the lifecycle (state.go), delegate to
// the Sandbox, publish the event. Errors are errdefs errors; they are
// mapped to gRPC codes once, in the ttrpc interceptor (ttrpc.go).
//
// Event order, as containerd's runc shim keeps it: create, start, exec
// added, exec started, then exits; a container's init exit is published
// after the exits of its execs; delete last. An exit is published only
// once the process's output has been flushed to its destination, and Wait
// returns only after the exit was published.
//
// One mutex guards all lifecycle state and is never held across a VM boot
// or a call into the guest: an operation checks the state under the lock,
// marks what it is about (starting, or a reserved id), calls the guest
// unlocked, and commits under the lock again.
package task

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"google.golang.org/protobuf/proto"

	"github.com/cocoonrt/cocoon/shim/stdio"
)

// Publisher sends events to containerd.
type Publisher interface {
	// Publish queues event under topic; containerd receives events in the
	// order they were published. It does not block on containerd.
	Publish(ctx context.Context, topic string, event proto.Message)
}

// Options configure a Service.
type Options struct {
	// Namespace is the containerd namespace the shim serves.
	Namespace string
	// Launcher boots the sandbox's VM on the first Create.
	Launcher Launcher
	// Publisher sends events to containerd.
	Publisher Publisher
	// Shutdown ends the serving process; the Shutdown RPC calls it once
	// no container is left.
	Shutdown func()
	// ExecExitGrace bounds how long an init's exit waits for the exits
	// of its execs, which are SIGKILLed then (default defaultExecGrace).
	ExecExitGrace time.Duration
}

// defaultExecGrace is how long an init's exit waits for its SIGKILLed
// execs to be reported gone. A SIGKILLed process goes at once, and its
// output is given outputGrace; the bound is well inside the 10 s that
// clients give a SIGKILL before they take the task for hung (Docker then
// kills the task's pid, QEMU's, itself).
const defaultExecGrace = 3 * time.Second

// Service is the Task service of one sandbox.
type Service struct {
	// ns is the containerd namespace.
	ns string
	// launcher boots the VM; publisher sends events; shutdown ends the
	// serving process (see Options).
	launcher  Launcher
	publisher Publisher
	shutdown  func()
	// execGrace bounds the wait for execs when an init exits.
	execGrace time.Duration
	// ctx lives as long as the service: the exit waiters run in it.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards containers, reserved, vm and every process's lifecycle
	// fields. It is never held across a guest call or a VM boot.
	mu sync.Mutex
	// containers are the created containers by id.
	containers map[string]*container
	// reserved holds the ids whose Create is in flight.
	reserved map[string]struct{}
	// vm is the sandbox's VM: booting, booted, or nil before the first
	// Create and after the last Delete.
	vm *vmSlot
	// closed is set by Close: from then on nothing is created or booted.
	closed bool
}

// vmSlot is the sandbox's VM. Its fields are written once, before ready
// is closed. Whoever takes a slot out of Service.vm stops its VM (stopVM).
type vmSlot struct {
	// id is the sandbox id.
	id string
	// ready is closed once the boot has ended.
	ready chan struct{}
	// sb is the booted sandbox; err why it cannot be used (the boot
	// failed, or the shim was closed while it booted).
	sb  Sandbox
	err error
}

// New returns a Service.
func New(o Options) *Service {
	ctx, cancel := context.WithCancel(context.Background())
	if o.ExecExitGrace <= 0 {
		o.ExecExitGrace = defaultExecGrace
	}
	return &Service{
		ns:         o.Namespace,
		launcher:   o.Launcher,
		publisher:  o.Publisher,
		shutdown:   o.Shutdown,
		execGrace:  o.ExecExitGrace,
		ctx:        ctx,
		cancel:     cancel,
		containers: make(map[string]*container),
		reserved:   make(map[string]struct{}),
	}
}

// Close stops the sandbox's VM if one runs: the serving process calls it
// on the way out, whatever containers remain. It is terminal: a Create
// after it, or one whose boot it overtook, is refused, so that no VM
// starts that nothing would stop.
func (s *Service) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	vm := s.vm
	s.vm = nil
	s.mu.Unlock()
	defer s.cancel()
	return stopVM(ctx, vm)
}

// publish queues an event. Callers hold s.mu, which is what keeps the
// order of events the order of the state changes they report.
func (s *Service) publish(topic string, event proto.Message) {
	s.publisher.Publish(s.ctx, topic, event)
}

// lookup returns container id and the process execID of it.
// Callers hold s.mu.
func (s *Service) lookup(id, execID string) (*container, *process, error) {
	c, ok := s.containers[id]
	if !ok {
		return nil, nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	if execID == "" {
		return c, c.init, nil
	}
	p, ok := c.execs[execID]
	if !ok {
		return nil, nil, fmt.Errorf("exec %s of container %s: %w", execID, id, errdefs.ErrNotFound)
	}
	return c, p, nil
}

// target is a process and what acting on it needs, read under s.mu.
type target struct {
	// sb is the sandbox's VM; nil if it is not running.
	sb Sandbox
	// c and p are the container and the process.
	c *container
	p *process
	// guest and io are p's guest process and stdio, nil until made.
	guest Process
	io    *stdio.IO
	// pid is the pid containerd is told for p.
	pid uint32
}

// find looks up a process and, unless o is empty, checks that o may be
// done to it now and that the VM runs. It takes s.mu.
func (s *Service) find(id, execID string, o op) (target, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.findLocked(id, execID, o)
}

// findLocked is find for callers that hold s.mu.
func (s *Service) findLocked(id, execID string, o op) (target, error) {
	c, p, err := s.lookup(id, execID)
	if err != nil {
		return target{}, err
	}
	t := target{c: c, p: p, guest: p.guest, io: p.io, pid: s.hostPIDLocked()}
	if s.vm != nil {
		t.sb = s.vm.sb
	}
	if o == "" {
		return t, nil
	}
	if err := p.state.check(o, p.name()); err != nil {
		return target{}, err
	}
	if t.sb == nil {
		return target{}, fmt.Errorf("cannot %s %s: the sandbox's VM is not running: %w", o, p.name(), errdefs.ErrFailedPrecondition)
	}
	return t, nil
}

// sandbox returns the VM, or an error if it is not running.
func (t target) sandbox() (Sandbox, error) {
	if t.sb == nil {
		return nil, fmt.Errorf("%s: the sandbox's VM is not running: %w", t.p.name(), errdefs.ErrFailedPrecondition)
	}
	return t.sb, nil
}

// started returns the guest process, or an error if p was not started.
func (t target) started(o op) (Process, error) {
	if t.guest == nil {
		return nil, fmt.Errorf("cannot %s %s: it has not been started: %w", o, t.p.name(), errdefs.ErrFailedPrecondition)
	}
	return t.guest, nil
}

// hostPIDLocked is the pid containerd is told for every process: the
// VMM's. Callers hold s.mu.
func (s *Service) hostPIDLocked() uint32 {
	if s.vm == nil || s.vm.sb == nil {
		return 0
	}
	return s.vm.sb.HostPID()
}

// shimPID is this process's pid, for Connect.
func shimPID() uint32 { return uint32(os.Getpid()) }

// logger returns ctx's logger with the process's fields.
func logger(ctx context.Context, id, execID string) *log.Entry {
	e := log.G(ctx).WithField("container", id)
	if execID != "" {
		e = e.WithField("exec", execID)
	}
	return e
}
