//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/agent/reaper"
	"github.com/cocoonrt/cocoon/guest/api"
)

// Bounds on container requests.
const (
	// MaxSpecSize bounds a container's OCI spec (JSON).
	MaxSpecSize = 4 << 20
	// MaxProcessSize bounds an exec's OCI process (JSON).
	MaxProcessSize = 1 << 20
	// MaxResourcesSize bounds the resources of UpdateContainer (JSON).
	MaxResourcesSize = 1 << 20
	// initExitTimeout bounds the wait, when a created container is
	// deleted, for the runtime's kill of its init to be reaped.
	initExitTimeout = 10 * time.Second
)

// cgroupParent is where containers' cgroups go unless the spec names an
// absolute path.
const cgroupParent = "/cocoon"

var containerIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,75}$`)

func validContainerID(id string) error {
	if !containerIDPattern.MatchString(id) {
		return fmt.Errorf("container id %q: want 1-76 characters of [A-Za-z0-9_.-], starting alphanumeric: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// RootfsAssembler builds container root filesystems in the guest.
type RootfsAssembler interface {
	// Assemble mounts the root filesystem r describes under dir, the
	// container's directory. On error nothing is left mounted.
	Assemble(ctx context.Context, dir string, r *api.Rootfs) (*Mounted, error)
}

// Mounted is an assembled root filesystem.
type Mounted struct {
	// Root is the path of the container's root.
	Root string
	// Release unmounts what Assemble mounted.
	Release func(context.Context) error
	// Upper is the overlay upperdir that holds the writable layer, which
	// ExportLayer hands back; empty when the root has no writable layer
	// of its own.
	Upper string
	// Changed writes the writable layer out to its disk and reports
	// whether anything was written to it since Assemble; nil without
	// Upper.
	Changed func() (bool, error)
	// Scratch is the mount point of the disk Upper is on, which
	// FreezeFilesystems freezes for a snapshot; empty when the writable
	// layer is not a filesystem of its own (or there is none).
	Scratch string
}

// changed reports through m.Changed, false without one.
func (m *Mounted) changed() (bool, error) {
	if m == nil || m.Changed == nil {
		return false, nil
	}
	return m.Changed()
}

// containerState is where a container is in its lifecycle:
//
//	created ──start──▶ running ──pause──▶ paused
//	   │                  ▲ ◀──resume──────┘
//	   └──── init exits (any state) ──▶ stopped ──delete──▶ gone
//
// A created container can be deleted too (the runtime kills its init).
type containerState int

const (
	// stateCreated: create succeeded; the init waits for start.
	stateCreated containerState = iota
	// stateRunning: the init runs its entrypoint.
	stateRunning
	// statePaused: the container's cgroup is frozen.
	statePaused
	// stateStopped: the init has exited.
	stateStopped
)

func (s containerState) String() string {
	switch s {
	case stateCreated:
		return "created"
	case stateRunning:
		return "running"
	case statePaused:
		return "paused"
	case stateStopped:
		return "stopped"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// lifecycleOp is a call that moves a container between states. While one
// runs, the container is busy and other lifecycle calls are refused; no
// lock is held across the runtime call itself.
type lifecycleOp struct {
	// doing names the op in the busy message.
	doing string
	// from are the states the op starts from; to is where it ends.
	from []containerState
	to   containerState
	// rule says, to a user, which states allow the op.
	rule string
	// quiesce refuses the op while processes are being executed, once
	// they have had execSettle to finish.
	quiesce bool
	// needsThawed refuses the op while the filesystems are frozen for a
	// snapshot: it unmounts or reads the writable layer.
	needsThawed bool
	// stay leaves the container in the state it was in.
	stay bool
}

var (
	opStart = lifecycleOp{doing: "started", from: []containerState{stateCreated}, to: stateRunning,
		rule: "only a created container can be started"}
	opPause = lifecycleOp{doing: "paused", from: []containerState{stateRunning}, to: statePaused,
		rule: "only a running container can be paused"}
	opResume = lifecycleOp{doing: "resumed", from: []containerState{statePaused}, to: stateRunning,
		rule: "only a paused container can be resumed"}
	opDelete = lifecycleOp{doing: "deleted", from: []containerState{stateCreated, stateStopped}, to: stateStopped,
		rule: "kill it and let it stop before deleting it", quiesce: true, needsThawed: true}
	// A paused container's processes are frozen, so its layer holds
	// still while it is read: the host takes it at pause, for commits
	// and checkpoints.
	opExport = lifecycleOp{doing: "exported", from: []containerState{stateCreated, statePaused, stateStopped}, stay: true,
		rule: "only a created, paused or stopped container's writable layer can be exported", quiesce: true, needsThawed: true}
)

// container is one container that the OCI runtime runs in the guest.
type container struct {
	id string
	// dir is the bundle: config.json, the rootfs mounts, the runtime's logs.
	dir string
	// cgroup is the container's cgroup v2 directory.
	cgroup string
	// init is the container's init process, also in Service.procs.
	init *process
	// rootfs is the container's assembled root filesystem.
	rootfs *Mounted
	// oomWatch is the inotify watch on memory.events; 0 when none.
	oomWatch int32
	// freeze is the agent's, which ops that need the filesystems thawed
	// enter.
	freeze *fsFreeze
	// userFiles is what the container sees of its user files.
	userFiles userFiles

	// mu guards the fields below.
	mu    sync.Mutex
	state containerState
	// busy names the lifecycle op in progress, "" when none.
	busy string
	// exited is set once the init has exited: the container is stopped,
	// whatever state says.
	exited bool
	// execs counts ExecProcess calls in progress.
	execs int
	// runtimeDeleted is set once the runtime forgot the container, so that a
	// retried delete only redoes the unmounts.
	runtimeDeleted bool
}

func (c *container) currentLocked() containerState {
	if c.exited {
		return stateStopped
	}
	return c.state
}

// current is the container's state.
func (c *container) current() containerState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.currentLocked()
}

// How long a delete or an export of a container waits for the processes
// being executed in it to finish starting, and how often it looks.
const (
	execSettle     = 5 * time.Second
	execSettlePoll = 10 * time.Millisecond
)

// begin starts op, or says why it cannot start.
func (c *container) begin(op lifecycleOp) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	// An exec still in progress when its container stopped ends soon:
	// it fails, or its process, started after the host gave up on the
	// call, is killed by the host's undo while the call is still
	// returning. A delete or an export waits for it, bounded.
	for settle := time.Now().Add(execSettle); op.quiesce && c.execs > 0 && time.Now().Before(settle); {
		c.mu.Unlock()
		time.Sleep(execSettlePoll)
		c.mu.Lock()
	}
	if c.busy != "" {
		return fmt.Errorf("container %s is being %s; try again once that is done: %w", c.id, c.busy, errdefs.ErrFailedPrecondition)
	}
	st := c.currentLocked()
	if !slices.Contains(op.from, st) {
		return fmt.Errorf("container %s is %s: %s: %w", c.id, st, op.rule, errdefs.ErrFailedPrecondition)
	}
	if op.quiesce && c.execs > 0 {
		return fmt.Errorf("container %s is starting a process; try again once that is done: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	if op.needsThawed {
		if err := c.freeze.enter(fmt.Sprintf("container %s cannot be %s", c.id, op.doing)); err != nil {
			return err
		}
	}
	c.busy = op.doing
	return nil
}

// end finishes op; on success the container moves to op.to.
func (c *container) end(op lifecycleOp, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if op.needsThawed {
		c.freeze.leave()
	}
	c.busy = ""
	if ok && !op.stay {
		c.state = op.to
	}
}

// initExited is the init process's onExit.
func (c *container) initExited(reaper.Exit) {
	c.mu.Lock()
	c.exited = true
	c.mu.Unlock()
}

// oomKills is the container's count of OOM kills so far; 0 without the
// memory controller.
func (c *container) oomKills() uint64 {
	n, _ := oomKills(filepath.Join(c.cgroup, "memory.events"))
	return n
}

// containerSet is the agent's containers and what drives them.
type containerSet struct {
	// oci runs the containers.
	oci *ociRuntime
	// rootfs assembles their root filesystems.
	rootfs RootfsAssembler
	// dir is Config.ContainerDir.
	dir string
	// cgroupRoot is Config.CgroupRoot.
	cgroupRoot string
	// max is Config.MaxContainers.
	max int
	// events wait for the host's NextEvent.
	events *eventQueue

	// mu guards byID, oom, oomErr and consoleSeq. A nil entry in byID
	// reserves an id while its container is created.
	mu     sync.Mutex
	byID   map[string]*container
	oom    *oomWatcher
	oomErr error
	// consoleSeq numbers console sockets, keeping their paths short.
	consoleSeq uint64
}

func setContainerDefaults(cfg *Config) {
	if cfg.Runtime == "" {
		cfg.Runtime = DefaultRuntime
	}
	if cfg.RuntimeRoot == "" {
		cfg.RuntimeRoot = DefaultRuntimeRoot
	}
	if cfg.ContainerDir == "" {
		cfg.ContainerDir = DefaultContainerDir
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = DefaultCgroupRoot
	}
	if cfg.Rootfs == nil {
		cfg.Rootfs = &DiskRootfs{SysDir: "/sys", DevDir: "/dev", Timeout: DefaultDiskTimeout}
	}
	if cfg.MaxContainers <= 0 {
		cfg.MaxContainers = DefaultMaxContainers
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = DefaultMaxEvents
	}
	if !cfg.NoPivot && rootCannotPivot() {
		cfg.NoPivot = true
	}
}

func newContainerSet(cfg Config) *containerSet {
	return &containerSet{
		oci:        &ociRuntime{path: cfg.Runtime, root: cfg.RuntimeRoot, noPivot: cfg.NoPivot, reaper: cfg.Reaper},
		rootfs:     cfg.Rootfs,
		dir:        cfg.ContainerDir,
		cgroupRoot: cfg.CgroupRoot,
		max:        cfg.MaxContainers,
		events:     newEventQueue(cfg.MaxEvents),
		byID:       make(map[string]*container),
	}
}

func (cs *containerSet) reserve(id string) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if _, ok := cs.byID[id]; ok {
		return fmt.Errorf("container %s: %w", id, errdefs.ErrAlreadyExists)
	}
	if len(cs.byID) >= cs.max {
		return fmt.Errorf("%d containers in the guest (delete stopped ones): %w", len(cs.byID), errdefs.ErrResourceExhausted)
	}
	cs.byID[id] = nil
	return nil
}

func (cs *containerSet) unreserve(id string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c, ok := cs.byID[id]; ok && c == nil {
		delete(cs.byID, id)
	}
}

// get returns a created container.
func (cs *containerSet) get(id string) (*container, error) {
	if err := validContainerID(id); err != nil {
		return nil, err
	}
	cs.mu.Lock()
	c, ok := cs.byID[id]
	cs.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	if c == nil {
		return nil, fmt.Errorf("container %s is still being created: %w", id, errdefs.ErrFailedPrecondition)
	}
	return c, nil
}

// watchOOM watches the container's memory.events. A guest without the
// memory controller, or without inotify, runs containers without OOM
// events; that is logged, not fatal.
func (cs *containerSet) watchOOM(ctx context.Context, c *container) {
	path := filepath.Join(c.cgroup, "memory.events")
	if _, err := os.Stat(path); err != nil {
		log.G(ctx).WithField("container", c.id).WithError(err).Debug("no memory.events: no OOM events for this container")
		return
	}
	cs.mu.Lock()
	if cs.oom == nil && cs.oomErr == nil {
		// The watcher outlives this request; its logs carry no
		// request's fields.
		bg := context.Background()
		cs.oom, cs.oomErr = newOOMWatcher(bg, func(id string, kills uint64) {
			cs.events.push(bg, &api.Event{Kind: api.Event_OOM, ContainerId: id, OomKills: kills})
		})
		if cs.oomErr != nil {
			log.G(ctx).WithError(cs.oomErr).Warn("containers get no OOM events")
		}
	}
	w := cs.oom
	cs.mu.Unlock()
	if w == nil {
		return
	}
	wd, err := w.add(c.id, path)
	if err != nil {
		log.G(ctx).WithField("container", c.id).WithError(err).Warn("no OOM events for this container")
		return
	}
	c.oomWatch = wd
}

func (cs *containerSet) unwatchOOM(c *container) {
	cs.mu.Lock()
	w := cs.oom
	cs.mu.Unlock()
	if w != nil && c.oomWatch != 0 {
		w.remove(c.oomWatch)
		c.oomWatch = 0
	}
}

// parseSpec decodes and checks a container's spec.
func parseSpec(id string, data []byte) (*bundleSpec, error) {
	if len(data) > MaxSpecSize {
		return nil, fmt.Errorf("container %s: spec of %d bytes, at most %d: %w", id, len(data), MaxSpecSize, errdefs.ErrInvalidArgument)
	}
	spec, err := decodeBundleSpec(data)
	if err != nil {
		return nil, fmt.Errorf("container %s: spec: %w: %v", id, errdefs.ErrInvalidArgument, err)
	}
	if spec.process == nil || len(spec.Args) == 0 {
		return nil, fmt.Errorf("container %s: spec has no process to run: %w", id, errdefs.ErrInvalidArgument)
	}
	if spec.linux == nil {
		return nil, fmt.Errorf("container %s: spec has no linux section: %w", id, errdefs.ErrInvalidArgument)
	}
	path, err := guestCgroupsPath(id, spec.CgroupsPath)
	if err != nil {
		return nil, err
	}
	spec.CgroupsPath = path
	if err := spec.downlevel(id); err != nil {
		return nil, err
	}
	return spec, nil
}

// guestCgroupsPath is where the container's cgroup goes: the spec's
// path if it is an absolute cgroupfs path, else /cocoon/<id>. The guest
// has no systemd, so the slice:prefix:name form is refused.
func guestCgroupsPath(id, p string) (string, error) {
	if p == "" {
		return cgroupParent + "/" + id, nil
	}
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" || strings.Contains(p, ":") {
		return "", fmt.Errorf("container %s: cgroupsPath %q: want an absolute cgroupfs path (the guest has no systemd): %w", id, p, errdefs.ErrInvalidArgument)
	}
	return p, nil
}

// execProcess is what the agent reads of an exec's OCI process; the
// runtime gets the process as the host sent it.
type execProcess struct {
	Terminal bool     `json:"terminal"`
	Args     []string `json:"args"`
	// raw is the whole process, its members as sent.
	raw rawObject
}

// parseProcess decodes and checks an exec's process.
func parseProcess(id string, data []byte) (*execProcess, error) {
	if len(data) > MaxProcessSize {
		return nil, fmt.Errorf("process %s: %d bytes, at most %d: %w", id, len(data), MaxProcessSize, errdefs.ErrInvalidArgument)
	}
	var raw rawObject
	var p execProcess
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("process %s: %w: %v", id, errdefs.ErrInvalidArgument, err)
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("process %s: %w: %v", id, errdefs.ErrInvalidArgument, err)
	}
	if len(p.Args) == 0 {
		return nil, fmt.Errorf("process %s: no program to run: %w", id, errdefs.ErrInvalidArgument)
	}
	if extra := processAdditions(raw); len(extra) > 0 {
		return nil, fmt.Errorf("process %s: the guest's OCI runtime reads runtime-spec %s, without %s: %w",
			id, runtimeSpecVersion, strings.Join(extra, ", "), errdefs.ErrNotImplemented)
	}
	p.raw = raw
	return &p, nil
}

// undoStack holds the cleanups of a call, run in reverse if it fails.
type undoStack []func()

func (u *undoStack) push(f func()) { *u = append(*u, f) }

func (u *undoStack) run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
	*u = nil
}

// CreateContainer assembles the container's rootfs, writes its bundle
// and runs the runtime's `create`; the init process exists, stopped before its
// entrypoint, when it returns.
func (s *Service) CreateContainer(ctx context.Context, req *api.CreateContainerRequest) (_ *api.CreateContainerResponse, retErr error) {
	called := time.Now()
	cs := s.containers
	id := req.ContainerId
	if err := validContainerID(id); err != nil {
		return nil, err
	}
	if err := api.ValidID(req.ProcessId); err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	if req.Rootfs == nil || len(req.Rootfs.Layers) == 0 {
		return nil, fmt.Errorf("container %s: rootfs has no layers: %w", id, errdefs.ErrInvalidArgument)
	}
	spec, err := parseSpec(id, req.Spec)
	if err != nil {
		return nil, err
	}
	terminal := spec.Terminal
	if terminal && req.Stderr {
		return nil, fmt.Errorf("container %s: a terminal has no separate stderr stream: %w", id, errdefs.ErrInvalidArgument)
	}
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("container", id))

	// Entered first: a mount that began before a freeze would wait on it.
	if err := s.freeze.enter(fmt.Sprintf("container %s cannot be created", id)); err != nil {
		return nil, err
	}
	defer s.freeze.leave()
	if err := cs.reserve(id); err != nil {
		return nil, err
	}
	var undo undoStack
	defer func() {
		if retErr != nil {
			undo.run()
			cs.unreserve(id)
		}
	}()
	cleanupCtx := context.WithoutCancel(ctx)
	if err := s.reserve(req.ProcessId); err != nil {
		return nil, err
	}
	undo.push(func() { s.unreserve(req.ProcessId) })
	// Claimed first: the host opened the streams before this call, and
	// they must not expire while the disks are awaited.
	cio, err := s.newContainerIO(ctx, req.ProcessId, terminal, req.Stdin, req.Stdout, req.Stderr)
	if err != nil {
		return nil, err
	}
	undo.push(cio.abort)
	// Before any disk is awaited: bind mounts of host directories need
	// the host's share, and a broken one fails the create at once.
	if err := s.share.prepare(ctx, id, spec); err != nil {
		return nil, err
	}
	if err := s.shm.prepare(ctx, id, spec); err != nil {
		return nil, err
	}
	sysctls, err := spec.takeNetworkSysctls()
	if err != nil {
		return nil, fmt.Errorf("container %s: %w: %v", id, errdefs.ErrInvalidArgument, err)
	}
	if err := setNetworkSysctls(ctx, s.cfg.ProcRoot, id, sysctls); err != nil {
		return nil, err
	}

	dir := filepath.Join(cs.dir, id)
	if err := os.MkdirAll(cs.dir, 0o711); err != nil {
		return nil, fmt.Errorf("container %s: %w", id, err)
	}
	// 0711, as containerd makes a bundle: the root of a user namespace
	// that maps it to another uid must reach its rootfs through it.
	if err := os.Mkdir(dir, 0o711); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("container %s: directory %s is left over from an earlier container: %w", id, dir, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("container %s: %w", id, err)
	}
	// Not removed while something may still be mounted in it: removing
	// would reach into the mounted filesystems.
	stillMounted := false
	undo.push(func() {
		if !stillMounted {
			_ = os.RemoveAll(dir)
		}
	})

	// Where the time of a create goes, for the log line at its end.
	began := time.Now()
	mounted, err := cs.rootfs.Assemble(ctx, dir, req.Rootfs)
	assembled := time.Since(began)
	if err != nil {
		return nil, fmt.Errorf("container %s: assemble rootfs: %w", id, err)
	}
	root := mounted.Root
	undo.push(func() {
		if err := mounted.Release(cleanupCtx); err != nil {
			stillMounted = true
			log.G(ctx).WithError(err).Warn("unmount rootfs")
		}
	})
	files, err := userFilesOf(spec)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w: %v", id, errdefs.ErrInvalidArgument, err)
	}
	resp := &api.CreateContainerResponse{}
	var provisioned time.Duration
	if req.ExecUser != nil {
		began := time.Now()
		if err := provisionAtCreate(ctx, id, files, root, req, resp); err != nil {
			return nil, err
		}
		provisioned = time.Since(began)
	}
	// After the provisioning: the init's HOME is the user's.
	if _, err := withHome(spec.process, root, files); err != nil {
		return nil, fmt.Errorf("container %s: process: %w: %v", id, errdefs.ErrInvalidArgument, err)
	}
	config, err := spec.marshal(root)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", id, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), config, 0o600); err != nil {
		return nil, fmt.Errorf("container %s: write bundle: %w", id, err)
	}

	adoption := s.cfg.Reaper.Expect()
	defer adoption.Done()
	pidFile := filepath.Join(dir, "init.pid")
	createBegan := time.Now()
	if err := cs.oci.create(ctx, id, dir, pidFile, cio.socketPath, cio.ociStdio()); err != nil {
		return nil, fmt.Errorf("container %s: %w", id, err)
	}
	ociCreate := time.Since(createBegan)
	undo.push(func() {
		// Kills the init too; the reaper collects it.
		if err := cs.oci.delete(cleanupCtx, id, dir); err != nil {
			log.G(ctx).WithError(err).Warn("undo create")
		}
	})
	pid, err := readPidFile(pidFile)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", id, err)
	}
	child, err := adoption.Adopt(pid)
	if err != nil {
		return nil, fmt.Errorf("container %s: init process: %w", id, err)
	}
	if err := cio.started(); err != nil {
		return nil, fmt.Errorf("container %s: %w", id, err)
	}

	c := &container{
		id:     id,
		dir:    dir,
		cgroup: filepath.Join(cs.cgroupRoot, spec.CgroupsPath),
		rootfs: mounted,
		freeze: s.freeze,
		state:  stateCreated,

		userFiles: files,
	}
	p := &process{id: req.ProcessId, child: child, stdio: cio.pio, exited: make(chan struct{}), onExit: c.initExited, oomKills: c.oomKills}
	c.init = p
	cs.watchOOM(ctx, c)
	cio.pio.start(ctx)
	go s.watch(cleanupCtx, p)
	s.mu.Lock()
	s.procs[req.ProcessId] = p
	s.mu.Unlock()
	cs.mu.Lock()
	cs.byID[id] = c
	cs.mu.Unlock()
	log.G(ctx).WithField("pid", pid).WithField("process", req.ProcessId).
		WithField("rootfs_ms", assembled.Milliseconds()).WithField("user_ms", provisioned.Milliseconds()).
		WithField("create_ms", ociCreate.Milliseconds()).
		WithField("total_ms", time.Since(called).Milliseconds()).WithField("pivot_root", !cs.oci.noPivot).
		Info("container created")
	resp.Pid = uint32(pid)
	return resp, nil
}

// StartContainer runs the runtime's `start`.
func (s *Service) StartContainer(ctx context.Context, req *api.ContainerRequest) (*api.Empty, error) {
	return s.lifecycle(ctx, req.ContainerId, opStart, s.containers.oci.start)
}

// PauseContainer freezes the container (`pause`).
func (s *Service) PauseContainer(ctx context.Context, req *api.ContainerRequest) (*api.Empty, error) {
	return s.lifecycle(ctx, req.ContainerId, opPause, s.containers.oci.pause)
}

// ResumeContainer thaws the container (`resume`).
func (s *Service) ResumeContainer(ctx context.Context, req *api.ContainerRequest) (*api.Empty, error) {
	return s.lifecycle(ctx, req.ContainerId, opResume, s.containers.oci.resume)
}

func (s *Service) lifecycle(ctx context.Context, id string, op lifecycleOp, call func(ctx context.Context, id, dir string) error) (*api.Empty, error) {
	c, err := s.containers.get(id)
	if err != nil {
		return nil, err
	}
	if err := c.begin(op); err != nil {
		return nil, err
	}
	err = call(ctx, c.id, c.dir)
	c.end(op, err == nil)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", id, err)
	}
	log.G(ctx).WithField("container", id).Debugf("container %s", op.doing)
	return &api.Empty{}, nil
}

// ExecProcess runs a process in a running container (`exec`).
func (s *Service) ExecProcess(ctx context.Context, req *api.ExecProcessRequest) (_ *api.StartProcessResponse, retErr error) {
	if err := api.ValidID(req.ProcessId); err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	c, err := s.containers.get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	proc, err := parseProcess(req.ProcessId, req.Process)
	if err != nil {
		return nil, err
	}
	if proc.Terminal && req.Stderr {
		return nil, fmt.Errorf("process %s: a terminal has no separate stderr stream: %w", req.ProcessId, errdefs.ErrInvalidArgument)
	}
	c.mu.Lock()
	if st := c.currentLocked(); st != stateRunning {
		c.mu.Unlock()
		return nil, fmt.Errorf("container %s is %s: processes can only be executed in a running container: %w", c.id, st, errdefs.ErrFailedPrecondition)
	}
	c.execs++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.execs--
		c.mu.Unlock()
	}()

	if err := s.reserve(req.ProcessId); err != nil {
		return nil, err
	}
	var undo undoStack
	defer func() {
		if retErr != nil {
			undo.run()
		}
	}()
	undo.push(func() { s.unreserve(req.ProcessId) })
	cio, err := s.newContainerIO(ctx, req.ProcessId, proc.Terminal, req.Stdin, req.Stdout, req.Stderr)
	if err != nil {
		return nil, err
	}
	undo.push(cio.abort)

	// Process ids may start with dots; the prefix keeps these names
	// inside the directory.
	processFile := filepath.Join(c.dir, "exec-"+req.ProcessId+".json")
	pidFile := filepath.Join(c.dir, "exec-"+req.ProcessId+".pid")
	defer os.Remove(processFile)
	defer os.Remove(pidFile)
	procJSON, err := processWithHome(req.Process, proc.raw, c)
	if err != nil {
		return nil, fmt.Errorf("process %s: %w: %v", req.ProcessId, errdefs.ErrInvalidArgument, err)
	}
	if err := os.WriteFile(processFile, procJSON, 0o600); err != nil {
		return nil, fmt.Errorf("process %s: %w", req.ProcessId, err)
	}
	adoption := s.cfg.Reaper.Expect()
	defer adoption.Done()
	if err := s.containers.oci.exec(ctx, c.id, c.dir, processFile, pidFile, cio.socketPath, cio.ociStdio()); err != nil {
		if c.current() == stateStopped {
			return nil, fmt.Errorf("container %s stopped while process %s was being executed: %w", c.id, req.ProcessId, errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("exec process %s in container %s: %w", req.ProcessId, c.id, err)
	}
	pid, err := readPidFile(pidFile)
	if err != nil {
		return nil, fmt.Errorf("process %s: %w", req.ProcessId, err)
	}
	child, err := adoption.Adopt(pid)
	if err != nil {
		// Not ours to wait for, but not to be left running either.
		_ = unix.Kill(pid, unix.SIGKILL)
		return nil, fmt.Errorf("process %s: %w", req.ProcessId, err)
	}
	if err := cio.started(); err != nil {
		_ = child.Signal(unix.SIGKILL, false)
		<-child.Done()
		return nil, fmt.Errorf("process %s: %w", req.ProcessId, err)
	}
	p := &process{id: req.ProcessId, child: child, stdio: cio.pio, exited: make(chan struct{})}
	cio.pio.start(ctx)
	go s.watch(context.WithoutCancel(ctx), p)
	s.mu.Lock()
	s.procs[req.ProcessId] = p
	s.mu.Unlock()
	log.G(ctx).WithField("container", c.id).WithField("process", req.ProcessId).WithField("pid", pid).Debug("process executed")
	return &api.StartProcessResponse{Pid: uint32(pid)}, nil
}

// KillContainer signals the container's init, or all its processes.
func (s *Service) KillContainer(ctx context.Context, req *api.KillContainerRequest) (*api.Empty, error) {
	if req.Signal == 0 || req.Signal > maxSignal {
		return nil, fmt.Errorf("signal %d: %w", req.Signal, errdefs.ErrInvalidArgument)
	}
	c, err := s.containers.get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	notRunning := func() error {
		return fmt.Errorf("container %s has stopped: no process to signal: %w", c.id, errdefs.ErrNotFound)
	}
	if c.current() == stateStopped {
		return nil, notRunning()
	}
	if err := s.containers.oci.kill(ctx, c.id, c.dir, unix.Signal(req.Signal), req.All); err != nil {
		if c.current() == stateStopped {
			// The init exited meanwhile.
			return nil, notRunning()
		}
		return nil, fmt.Errorf("container %s: %w", c.id, err)
	}
	return &api.Empty{}, nil
}

// DeleteContainer removes a created or stopped container: `delete`,
// then its rootfs is unmounted and its directory removed. The processes'
// exit statuses stay for WaitProcess.
func (s *Service) DeleteContainer(ctx context.Context, req *api.ContainerRequest) (*api.Empty, error) {
	cs := s.containers
	c, err := cs.get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	if err := c.begin(opDelete); err != nil {
		return nil, err
	}
	ok := false
	defer func() { c.end(opDelete, ok) }()
	c.mu.Lock()
	runtimeDeleted := c.runtimeDeleted
	c.mu.Unlock()
	if !runtimeDeleted {
		if err := cs.oci.delete(ctx, c.id, c.dir); err != nil {
			return nil, fmt.Errorf("container %s: %w", c.id, err)
		}
		c.mu.Lock()
		c.runtimeDeleted = true
		c.mu.Unlock()
	}
	// delete kills the init of a created container; nothing may run
	// in the rootfs when it is unmounted.
	timer := time.NewTimer(initExitTimeout)
	defer timer.Stop()
	select {
	case <-c.init.child.Done():
	case <-timer.C:
		return nil, fmt.Errorf("container %s: init process did not exit within %s of the runtime's delete: %w", c.id, initExitTimeout, errdefs.ErrUnavailable)
	case <-ctx.Done():
		return nil, fmt.Errorf("container %s: wait for init to exit: %w", c.id, ctx.Err())
	}
	cs.unwatchOOM(c)
	if err := c.rootfs.Release(ctx); err != nil {
		return nil, fmt.Errorf("container %s: unmount rootfs: %w", c.id, err)
	}
	if err := os.RemoveAll(c.dir); err != nil {
		return nil, fmt.Errorf("container %s: %w", c.id, err)
	}
	cs.mu.Lock()
	delete(cs.byID, c.id)
	cs.mu.Unlock()
	ok = true
	log.G(ctx).WithField("container", c.id).Info("container deleted")
	return &api.Empty{}, nil
}

// UpdateContainer applies new resource limits (`update`).
func (s *Service) UpdateContainer(ctx context.Context, req *api.UpdateContainerRequest) (*api.Empty, error) {
	c, err := s.containers.get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	if len(req.Resources) > MaxResourcesSize {
		return nil, fmt.Errorf("container %s: resources of %d bytes, at most %d: %w", c.id, len(req.Resources), MaxResourcesSize, errdefs.ErrInvalidArgument)
	}
	var res specs.LinuxResources
	if err := json.Unmarshal(req.Resources, &res); err != nil {
		return nil, fmt.Errorf("container %s: resources: %w: %v", c.id, errdefs.ErrInvalidArgument, err)
	}
	if st := c.current(); st == stateStopped {
		return nil, fmt.Errorf("container %s has stopped: its resources can no longer be updated: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	data, err := json.Marshal(&res)
	if err != nil {
		return nil, err
	}
	if err := s.containers.oci.update(ctx, c.id, c.dir, data); err != nil {
		return nil, fmt.Errorf("container %s: %w", c.id, err)
	}
	return &api.Empty{}, nil
}

// ContainerStats reads the container's cgroup v2 statistics.
func (s *Service) ContainerStats(ctx context.Context, req *api.ContainerRequest) (*api.ContainerStatsResponse, error) {
	c, err := s.containers.get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	m, err := cgroupMetrics(c.cgroup)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.id, err)
	}
	b, err := marshalMetrics(m)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.id, err)
	}
	return &api.ContainerStatsResponse{Metrics: b}, nil
}

// ContainerPids lists the processes in the container's cgroup.
func (s *Service) ContainerPids(ctx context.Context, req *api.ContainerRequest) (*api.ContainerPidsResponse, error) {
	c, err := s.containers.get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	pids, err := cgroupPids(c.cgroup)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.id, err)
	}
	return &api.ContainerPidsResponse{Pids: pids}, nil
}
