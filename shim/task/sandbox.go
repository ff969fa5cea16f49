package task

import (
	"context"
	"io"
	"syscall"
	"time"

	cgroupsv2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cocoonrt/cocoon/runtime/agent"
	"github.com/cocoonrt/cocoon/runtime/rootfs"
)

// Launcher boots the VM of a sandbox. The shim has one implementation
// (package shim/vm); tests have a fake.
type Launcher interface {
	// Launch boots the sandbox and returns once its guest agent is ready.
	// On error nothing is left running.
	Launch(ctx context.Context, r LaunchRequest) (Sandbox, error)
	// Restore brings a sandbox back from a checkpoint instead of
	// booting it, with the checkpoint's container as c, and returns it
	// with that container's init. The init's processes stay frozen
	// until StartContainer. On error nothing is left running.
	Restore(ctx context.Context, r LaunchRequest, checkpoint string, c ContainerSpec) (Sandbox, Process, error)
}

// LaunchRequest says which sandbox to boot and how.
type LaunchRequest struct {
	// Namespace is the containerd namespace; ID is the sandbox id (the
	// pod's sandbox id, or the container id of a standalone container).
	// Together they name the sandbox's state directory.
	Namespace string
	ID        string
	// Options are the runtime options containerd passed with the first
	// container; nil when there are none.
	Options *anypb.Any
	// Annotations are the OCI annotations of the first container (for a
	// pod: the sandbox container's, which carry the pod's).
	Annotations map[string]string
	// NetNS is the network namespace the first container's spec joins
	// (oci.NetworkNamespace), whose interfaces the VM mirrors; "" for
	// none.
	NetNS string
	// Resources are the first container's limits, which size the VM
	// (oci.SizeForResources); nil for none.
	Resources *specs.LinuxResources
	// CgroupsPath is the host cgroup of a pod's sandbox container
	// (its spec's linux.cgroupsPath, in the pod's cgroup), which the
	// shim joins before it starts the VM, so that the pod's cgroup
	// holds what the VM uses; "" for none.
	CgroupsPath string
	// NewNetNS, SpareNICs, HoldNetNS, BeforeNetwork, UndoNetwork and
	// Share are sandbox.Options' (oci.HostNetwork decides the namespace,
	// oci.LateNetwork the spares).
	NewNetNS      bool
	SpareNICs     int
	HoldNetNS     bool
	BeforeNetwork func(ctx context.Context, hookPID int) error
	UndoNetwork   func(ctx context.Context, hookPID int)
	Share         bool
}

// Sandbox is one booted VM and the containers in it, as the Task service
// sees it. Every method is a call into the guest, so none is made with the
// service's lock held.
type Sandbox interface {
	// HostPID is the host process that stands for the sandbox's
	// processes in containerd's API: the VMM's.
	HostPID() uint32
	// HookPID is the host pid OCI hooks get in their state: a process in
	// the sandbox's network namespace.
	HookPID() int
	// CreateContainer creates (does not start) a container in the guest
	// and returns its init process.
	CreateContainer(ctx context.Context, c ContainerSpec) (Process, error)
	// StartContainer starts a created container's init.
	StartContainer(ctx context.Context, id string) error
	// ExecProcess starts another process in a running container.
	ExecProcess(ctx context.Context, containerID, execID string, p *specs.Process, stdin io.Reader, stdout, stderr io.Writer) (Process, error)
	// KillContainer signals a container's init, or with all every process
	// in it.
	KillContainer(ctx context.Context, id string, sig syscall.Signal, all bool) error
	// DeleteContainer removes a container (killing it if it still runs)
	// and its rootfs from the guest.
	DeleteContainer(ctx context.Context, id string) error
	// FlushContainer copies a stopped container's writable layer back to
	// the host, for a VM that is stopped next, which then takes the
	// container and its rootfs with it.
	FlushContainer(ctx context.Context, id string) error
	// PauseContainer freezes every process of a container.
	PauseContainer(ctx context.Context, id string) error
	// ResumeContainer thaws a paused container.
	ResumeContainer(ctx context.Context, id string) error
	// UpdateContainer changes a container's resource limits.
	UpdateContainer(ctx context.Context, id string, r *specs.LinuxResources) error
	// ContainerStats returns a container's cgroup v2 metrics.
	ContainerStats(ctx context.Context, id string) (*cgroupsv2stats.Metrics, error)
	// ContainerPids lists the guest pids of a container's processes.
	ContainerPids(ctx context.Context, id string) ([]uint32, error)
	// Events delivers what the guest reports on its own (OOM kills). It
	// is closed when the sandbox stops.
	Events() <-chan SandboxEvent
	// Stop shuts the VM down and removes its state. Safe to call more
	// than once.
	Stop(ctx context.Context) error
	// Dead is closed when the VM ended without Stop: it crashed or was
	// killed, or its guest broke its session or stopped answering. Its
	// processes are gone; deleting its containers and Stop still work.
	Dead() <-chan struct{}
	// GuestTime is the time spent so far in calls the guest agent works
	// on (not those waiting for exits or events).
	GuestTime() time.Duration
	// Checkpoint saves the whole VM into a directory (see
	// CheckpointRequest).
	Checkpoint(ctx context.Context, r CheckpointRequest) error
}

// CheckpointRequest is a checkpoint of the sandbox's container.
type CheckpointRequest struct {
	// ContainerID is the container asked for; Dir is containerd's
	// directory for the checkpoint; Namespace is recorded in it.
	ContainerID string
	Dir         string
	Namespace   string
	// Exit ends the container once saved.
	Exit bool
	// Paused says the client paused the container first.
	Paused bool
}

// ContainerSpec describes a container to create in the guest.
type ContainerSpec struct {
	// ID is the container id.
	ID string
	// Spec is the container's OCI spec, as read from the bundle.
	Spec *specs.Spec
	// Rootfs are the mounts containerd prepared for the root filesystem.
	Rootfs []rootfs.Mount
	// Stdin, Stdout and Stderr are the init process's stdio; nil ones are
	// not connected. With a terminal Stderr is nil.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Process is a process in the guest: *agent.Process has these methods.
type Process interface {
	// Pid is the process's pid in the guest.
	Pid() uint32
	// Wait returns how the process ended, once it has and its output has
	// been written to the process's writers in full.
	Wait(ctx context.Context) (agent.ExitStatus, error)
	// Signal sends sig to the process, or with group to its process group.
	Signal(ctx context.Context, sig syscall.Signal, group bool) error
	// CloseStdin makes the process read EOF once the stdin read so far is
	// delivered.
	CloseStdin(ctx context.Context) error
	// Resize sets the size of the process's terminal.
	Resize(ctx context.Context, width, height uint32) error
}

var _ Process = (*agent.Process)(nil)

// SandboxEventKind says what a SandboxEvent reports.
type SandboxEventKind int

const (
	// EventOOM reports that the kernel's OOM killer hit a container.
	EventOOM SandboxEventKind = iota + 1
)

// SandboxEvent is something the guest reported about a container.
type SandboxEvent struct {
	// Kind is what happened.
	Kind SandboxEventKind
	// ContainerID is the container it happened to.
	ContainerID string
	// OOMKills is the container's count of OOM kills so far (EventOOM).
	OOMKills uint64
}
