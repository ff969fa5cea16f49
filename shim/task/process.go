package task

import (
	"fmt"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/shim/stdio"
)

// container is a container of the sandbox: its init and its execs.
type container struct {
	// id is the container id; bundle its bundle directory.
	id     string
	bundle string
	// hooks are the spec's hooks that run on the host; nil for none.
	hooks *hostHooks
	// init is the container's first process; its state is the
	// container's.
	init *process
	// execs are the exec processes by exec id; guarded by Service.mu.
	execs map[string]*process
	// oomKills is the count of the container's OOM kills reported to
	// containerd so far; guarded by Service.mu.
	oomKills uint64
	// oomPublished is when the last TaskOOM of the container was
	// published; guarded by Service.mu.
	oomPublished time.Time
	// oomPending is the highest count of kills the guest reported that
	// oomTimer will publish; guarded by Service.mu.
	oomPending uint64
	oomTimer   *time.Timer
	// timing is where the init's task calls spent their time; guarded
	// by Service.mu.
	timing timing
}

// process is a container's init or one of its execs. Its lifecycle fields
// are guarded by Service.mu; the rest is set before it is shared.
type process struct {
	// containerID and execID name it; execID is empty for the init.
	containerID string
	execID      string
	// stdio is the stdio containerd asked for.
	stdio stdio.Config
	// spec is an exec's process spec; nil for the init.
	spec *specs.Process

	// state is where the process is in its lifecycle.
	state state
	// guest is the process in the guest; nil until it was created there.
	guest Process
	// io is the open stdio; nil until opened.
	io *stdio.IO
	// exit is how the process ended; set when state becomes stopped.
	exit exitStatus
	// earlyExit holds an exit that arrived while Start was in flight:
	// Start publishes it after the start event.
	earlyExit *exitStatus
	// exited is closed once the exit is recorded and its event queued.
	exited chan struct{}
}

func newProcess(containerID, execID string, cfg stdio.Config, spec *specs.Process) *process {
	return &process{
		containerID: containerID,
		execID:      execID,
		stdio:       cfg,
		spec:        spec,
		exited:      make(chan struct{}),
	}
}

// exitStatus is how a process ended.
type exitStatus struct {
	// code is the exit status as runc reports it (128+signal if killed).
	code uint32
	// at is when it ended.
	at time.Time
	// oomKills is, for an init, the container's count of OOM kills at
	// the exit.
	oomKills uint64
}

// unknownExit is the status of a process whose end the guest could not
// report (the VM died): containerd's convention for "unknown".
const unknownExit = 255

// name says which process p is, for errors and logs.
func (p *process) name() string {
	if p.execID == "" {
		return fmt.Sprintf("container %s", p.containerID)
	}
	return fmt.Sprintf("exec %s of container %s", p.execID, p.containerID)
}
