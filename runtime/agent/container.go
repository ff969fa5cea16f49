package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"

	"github.com/cocoonrt/cocoon/guest/api"
)

// maxPids bounds the pids the client accepts from the guest.
const maxPids = 1 << 16

// maxMetricsBytes bounds the encoded metrics the client decodes: a
// container's cgroup v2 metrics take about 1 KiB, and the decoding of a
// message of empty repeated entries allocates some seventy times its size.
const maxMetricsBytes = 64 << 10

// Disk addresses a disk the host hot-plugged onto the guest's SCSI
// controller.
type Disk struct {
	// SCSIID and LUN are the disk's address on the controller.
	SCSIID, LUN uint32
	// FSType is the filesystem on the disk: "erofs" or "ext4".
	FSType string
	// ReadOnly is set for image layers.
	ReadOnly bool
}

// Rootfs is a container's root filesystem as disks.
type Rootfs struct {
	// Layers are the read-only image layers, lowest first.
	Layers []Disk
	// Scratch holds the writable layer; nil for a read-only root made
	// of a single layer.
	Scratch *Disk
}

// ContainerCreate is what CreateContainer needs.
type ContainerCreate struct {
	// ID is the container id.
	ID string
	// ProcessID names the init process in the agent (see ProcessSpec.ID).
	ProcessID string
	// Spec is the guest's OCI spec (JSON); root.path is set by the agent.
	Spec []byte
	// Rootfs are the disks the agent assembles the root from.
	Rootfs Rootfs
	// Stdin, Stdout and Stderr are the init's stdio, as in ProcessSpec;
	// with a terminal (process.terminal in Spec) Stderr must be nil.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// ExecCreate is what ExecProcess needs.
type ExecCreate struct {
	// ContainerID is the container to run the process in.
	ContainerID string
	// ProcessID names the process in the agent (see ProcessSpec.ID).
	ProcessID string
	// Process is the OCI process (JSON).
	Process []byte
	// Stdin, Stdout and Stderr are the process's stdio, as in
	// ProcessSpec.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// EventKind says what happened in the guest.
type EventKind int

const (
	// EventUnknown is an event this client does not know.
	EventUnknown EventKind = iota
	// EventOOM: the kernel OOM-killed a process of the container.
	EventOOM
)

func (k EventKind) String() string {
	switch k {
	case EventOOM:
		return "oom"
	}
	return "unknown"
}

// Event is something the guest reports about a container.
type Event struct {
	Kind        EventKind
	ContainerID string
	// OOMKills is the container's count of OOM kills so far (EventOOM).
	OOMKills uint64
}

func toDisk(d Disk) *api.Disk {
	return &api.Disk{ScsiId: d.SCSIID, Lun: d.LUN, Fstype: d.FSType, ReadOnly: d.ReadOnly}
}

// CreateContainer opens the init's stdio streams and creates the
// container (the OCI runtime's `create` in the guest). The returned Process is the
// init: Wait, Signal, Resize and CloseStdin work on it; it runs its
// entrypoint once StartContainer is called.
func (c *Client) CreateContainer(ctx context.Context, spec ContainerCreate) (*Process, error) {
	p, _, err := c.CreateContainerWithUser(ctx, spec, nil)
	return p, err
}

// CreateContainerWithUser is CreateContainer that, with u set, has the
// agent provision u in the assembled root filesystem before the runtime's
// create (so the init's HOME comes from it), and says how that went.
func (c *Client) CreateContainerWithUser(ctx context.Context, spec ContainerCreate, u *UserProvision) (*Process, UserOutcome, error) {
	req := &api.CreateContainerRequest{
		ContainerId: spec.ID,
		ProcessId:   spec.ProcessID,
		Spec:        spec.Spec,
		Rootfs:      &api.Rootfs{},
		Stdin:       spec.Stdin != nil,
		Stdout:      spec.Stdout != nil,
		Stderr:      spec.Stderr != nil,
	}
	for _, l := range spec.Rootfs.Layers {
		req.Rootfs.Layers = append(req.Rootfs.Layers, toDisk(l))
	}
	if s := spec.Rootfs.Scratch; s != nil {
		req.Rootfs.Scratch = toDisk(*s)
	}
	if u != nil {
		req.ExecUser = toAPIUser(u.ExecUser)
		req.ExecUserTimeoutNs = uint64(max(u.Timeout, 0))
		req.ExecUserRequired = u.Required
	}
	var out UserOutcome
	op := fmt.Sprintf("create container %s", spec.ID)
	p, err := c.startWithStdio(ctx, op, spec.ProcessID, spec.Stdin, spec.Stdout, spec.Stderr, func(ctx context.Context) (uint32, error) {
		resp, err := c.agent.CreateContainer(ctx, req)
		if err != nil {
			return 0, err
		}
		if u != nil {
			out = userOutcome(u, resp)
		}
		return resp.Pid, nil
	})
	if err == nil && u != nil && u.Required && out.Err != nil {
		// The guest created the container although the provisioning it
		// had to do failed its check: the caller undoes the create,
		// which ends the init and its streams.
		return nil, out, fmt.Errorf("%s: exec user %s: %w", op, u.User.Name, out.Err)
	}
	return p, out, err
}

// userOutcome reads the provisioning part of a CreateContainer answer.
func userOutcome(u *UserProvision, resp *api.CreateContainerResponse) UserOutcome {
	if msg := resp.ExecUserError; msg != "" {
		if len(msg) > maxGuestMessage {
			msg = strings.ToValidUTF8(msg[:maxGuestMessage], "") + " [truncated]"
		}
		return UserOutcome{Err: fmt.Errorf("%s", msg), Retry: resp.ExecUserRetry}
	}
	r := userReport(resp.ExecUser)
	if err := CheckUserReport(u.User, r); err != nil {
		return UserOutcome{Err: err, Retry: true}
	}
	return UserOutcome{Report: &r}
}

// ExecProcess opens the process's stdio streams and runs it in the
// container (the OCI runtime's `exec` in the guest).
func (c *Client) ExecProcess(ctx context.Context, spec ExecCreate) (*Process, error) {
	req := &api.ExecProcessRequest{
		ContainerId: spec.ContainerID,
		ProcessId:   spec.ProcessID,
		Process:     spec.Process,
		Stdin:       spec.Stdin != nil,
		Stdout:      spec.Stdout != nil,
		Stderr:      spec.Stderr != nil,
	}
	op := fmt.Sprintf("exec process %s in container %s", spec.ProcessID, spec.ContainerID)
	return c.startWithStdio(ctx, op, spec.ProcessID, spec.Stdin, spec.Stdout, spec.Stderr, func(ctx context.Context) (uint32, error) {
		resp, err := c.agent.ExecProcess(ctx, req)
		if err != nil {
			return 0, err
		}
		return resp.Pid, nil
	})
}

// startWithStdio opens the stdio streams of process id, then makes the
// call that starts it, as Start does for plain processes, or that attaches
// them to it (AttachProcess). On error the streams are closed and nothing
// is left in the guest.
func (c *Client) startWithStdio(ctx context.Context, op, id string, stdin io.Reader, stdout, stderr io.Writer, call func(context.Context) (uint32, error)) (_ *Process, retErr error) {
	if err := api.ValidID(id); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", op, errdefs.ErrInvalidArgument, err)
	}
	p := &Process{
		c:           c,
		id:          id,
		outputDone:  make(chan struct{}),
		stdinSem:    make(chan struct{}, 1),
		stdinCopied: make(chan struct{}),
		waitSem:     make(chan struct{}, 1),
	}
	var opened []net.Conn
	defer func() {
		if retErr != nil {
			for _, s := range opened {
				// Unblock local readers too: Close alone is a half-close.
				_ = s.SetDeadline(time.Now())
				_ = s.Close()
			}
		}
	}()
	open := func(kind api.StreamKind) (net.Conn, error) {
		s, err := openStream(c.sess, api.StreamHeader{Kind: kind, ID: id})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		opened = append(opened, s)
		return s, nil
	}
	if stdin != nil {
		s, err := open(api.StreamStdin)
		if err != nil {
			return nil, err
		}
		p.stdin = s
	}
	var wg sync.WaitGroup
	for _, o := range []struct {
		kind api.StreamKind
		w    io.Writer
	}{{api.StreamStdout, stdout}, {api.StreamStderr, stderr}} {
		if o.w == nil {
			continue
		}
		s, err := open(o.kind)
		if err != nil {
			return nil, err
		}
		p.outputs = append(p.outputs, s)
		wg.Add(1)
		go func() {
			defer wg.Done()
			copyOutput(ctx, o.w, s, id, o.kind)
		}()
	}
	go func() {
		wg.Wait()
		close(p.outputDone)
	}()
	pid, err := call(ctx)
	if err != nil {
		return nil, c.mapErr(op, err)
	}
	p.pid = pid
	if stdin != nil {
		go p.copyStdin(stdin)
	}
	return p, nil
}

func (c *Client) containerCall(ctx context.Context, op, id string, call func(context.Context, *api.ContainerRequest) (*api.Empty, error)) error {
	_, err := call(ctx, &api.ContainerRequest{ContainerId: id})
	return c.mapErr(fmt.Sprintf("%s container %s", op, id), err)
}

// StartContainer starts the container's init (the runtime's `start`).
func (c *Client) StartContainer(ctx context.Context, id string) error {
	return c.containerCall(ctx, "start", id, c.agent.StartContainer)
}

// DeleteContainer removes a created or stopped container and unmounts its
// root filesystem in the guest; its disks can be detached afterwards. Its
// writable layer is no longer there to export.
func (c *Client) DeleteContainer(ctx context.Context, id string) error {
	_, err := c.agent.DeleteContainer(ctx, &api.ContainerRequest{ContainerId: id})
	return c.mapErr(fmt.Sprintf("delete container %s", id), err)
}

// PauseContainer freezes the container.
func (c *Client) PauseContainer(ctx context.Context, id string) error {
	return c.containerCall(ctx, "pause", id, c.agent.PauseContainer)
}

// ResumeContainer thaws the container.
func (c *Client) ResumeContainer(ctx context.Context, id string) error {
	return c.containerCall(ctx, "resume", id, c.agent.ResumeContainer)
}

// KillContainer signals the container's init, or with all every process
// of the container. A stopped container is errdefs.ErrNotFound.
func (c *Client) KillContainer(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	if sig <= 0 {
		return fmt.Errorf("signal %d: %w", sig, errdefs.ErrInvalidArgument)
	}
	_, err := c.agent.KillContainer(ctx, &api.KillContainerRequest{ContainerId: id, Signal: uint32(sig), All: all})
	return c.mapErr(fmt.Sprintf("kill container %s", id), err)
}

// UpdateContainer applies resources, an OCI LinuxResources (JSON).
func (c *Client) UpdateContainer(ctx context.Context, id string, resources []byte) error {
	_, err := c.agent.UpdateContainer(ctx, &api.UpdateContainerRequest{ContainerId: id, Resources: resources})
	return c.mapErr(fmt.Sprintf("update container %s", id), err)
}

// ContainerStats returns the container's cgroup v2 statistics.
func (c *Client) ContainerStats(ctx context.Context, id string) (*stats.Metrics, error) {
	op := fmt.Sprintf("stats of container %s", id)
	resp, err := c.agent.ContainerStats(ctx, &api.ContainerRequest{ContainerId: id})
	if err != nil {
		return nil, c.mapErr(op, err)
	}
	if len(resp.Metrics) > maxMetricsBytes {
		return nil, fmt.Errorf("%s: guest sent %d bytes of metrics, at most %d: %w", op, len(resp.Metrics), maxMetricsBytes, errdefs.ErrDataLoss)
	}
	var m stats.Metrics
	if err := proto.Unmarshal(resp.Metrics, &m); err != nil {
		return nil, fmt.Errorf("%s: guest sent malformed metrics: %w: %v", op, errdefs.ErrDataLoss, err)
	}
	return &m, nil
}

// ContainerPids lists the guest pids of the container's processes.
func (c *Client) ContainerPids(ctx context.Context, id string) ([]uint32, error) {
	op := fmt.Sprintf("pids of container %s", id)
	resp, err := c.agent.ContainerPids(ctx, &api.ContainerRequest{ContainerId: id})
	if err != nil {
		return nil, c.mapErr(op, err)
	}
	if len(resp.Pids) > maxPids {
		return nil, fmt.Errorf("%s: guest sent %d pids, at most %d: %w", op, len(resp.Pids), maxPids, errdefs.ErrDataLoss)
	}
	return resp.Pids, nil
}

// NextEvent waits for the guest's next event until ctx ends. Keep one
// call in flight to receive events as they happen.
func (c *Client) NextEvent(ctx context.Context) (Event, error) {
	e, err := c.agent.NextEvent(ctx, &api.NextEventRequest{})
	if err != nil {
		return Event{}, c.mapErr("next guest event", err)
	}
	ev := Event{ContainerID: trim(e.ContainerId), OOMKills: e.OomKills}
	if e.Kind == api.Event_OOM {
		ev.Kind = EventOOM
	}
	return ev, nil
}

// FreezeFilesystems syncs the guest and freezes the filesystem of every
// container's scratch disk, for a snapshot of the VM and its disks that a
// restored guest finds consistent, and returns how many it froze. Until
// ThawFilesystems, writes to them block, and containers cannot be
// created or deleted nor layers exported (errdefs.ErrFailedPrecondition).
// Freezing a frozen guest changes nothing.
func (c *Client) FreezeFilesystems(ctx context.Context) (int, error) {
	resp, err := c.agent.FreezeFilesystems(ctx, &api.Empty{})
	if err != nil {
		return 0, c.mapErr("freeze guest filesystems", err)
	}
	return int(resp.Frozen), nil
}

// ThawFilesystems thaws what FreezeFilesystems froze, in this guest or in
// the one its snapshot was taken of; without a freeze it does nothing.
func (c *Client) ThawFilesystems(ctx context.Context) error {
	_, err := c.agent.ThawFilesystems(ctx, &api.Empty{})
	return c.mapErr("thaw guest filesystems", err)
}
