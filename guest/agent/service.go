//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/agent/reaper"
	"github.com/cocoonrt/cocoon/guest/api"
)

// Bounds on what the host may ask for. The host is trusted more than the
// guest, but a bug on its side must not exhaust a small guest.
const (
	// MaxEntropy is the most entropy SyncGuest credits per call.
	MaxEntropy = 512
	// maxHostname is HOST_NAME_MAX.
	maxHostname = 64
)

// Defaults for Config fields left zero.
const (
	DefaultMaxProcesses    = 1024
	DefaultStreamTimeout   = 10 * time.Second
	DefaultOutputDrainIdle = 2 * time.Second
	DefaultMaxContainers   = 256
	DefaultMaxEvents       = 128
	DefaultDiskTimeout     = 10 * time.Second
	DefaultReattachTimeout = 30 * time.Second
	// DefaultRuntime is the OCI runtime the guest image installs.
	DefaultRuntime      = "/usr/bin/crun"
	DefaultRuntimeRoot  = "/run/cocoon/oci"
	DefaultContainerDir = "/run/cocoon/containers"
	DefaultCgroupRoot   = "/sys/fs/cgroup"
)

// System performs guest-wide changes. The agent uses LinuxSystem; tests
// pass a fake so they never touch the clock of the machine they run on.
type System interface {
	// SetWallClock sets the realtime clock.
	SetWallClock(t time.Time) error
	// AddEntropy mixes b into the kernel's random pool and credits it.
	AddEntropy(b []byte) error
	// SetHostname sets the hostname.
	SetHostname(name string) error
	// PowerOff stops the guest. It returns only if that failed.
	PowerOff() error
}

// Config configures a Service. Zero durations and counts take the defaults.
type Config struct {
	// System performs the guest-wide operations of SyncGuest and Shutdown.
	System System
	// Reaper collects the exits of processes the service starts. It must
	// be the only waiter for children in the process.
	Reaper *reaper.Reaper
	// InitDuration is how long init duties took, reported by Ping.
	InitDuration time.Duration
	// MaxProcesses bounds processes known to the agent (running, or
	// exited and not yet waited for).
	MaxProcesses int
	// StreamTimeout bounds how long StartProcess waits for the stdio
	// streams it names, and how long a stream waits for its StartProcess.
	StreamTimeout time.Duration
	// OutputDrainIdle ends the output of an exited process once nothing
	// arrived for this long (a background child may hold its pipes).
	OutputDrainIdle time.Duration
	// ReattachTimeout bounds how long a process's stdio waits for an
	// AttachProcess once the session it was attached in has ended and a
	// stream of it failed: meanwhile its output stays in the pipe (the
	// process blocks once the pipe is full) and its exit is not reported.
	// After it the output is discarded and stdin reads EOF.
	ReattachTimeout time.Duration

	// Runtime is the OCI runtime binary (crun, or runc) that runs
	// containers.
	Runtime string
	// RuntimeRoot is the runtime's state directory (--root).
	RuntimeRoot string
	// NoPivot makes the runtime enter container roots with MS_MOVE and
	// chroot instead of pivot_root. It is turned on by itself when the
	// agent's root is the kernel's rootfs, which pivot_root cannot leave
	// (as PID 1 the agent mounts over it first: initd).
	NoPivot bool
	// ContainerDir holds each container's bundle and root filesystem
	// mounts, in a directory named after the container.
	ContainerDir string
	// CgroupRoot is where the cgroup v2 hierarchy is mounted; container
	// statistics, pids and OOM events are read there.
	CgroupRoot string
	// Rootfs assembles container root filesystems; nil means from the
	// SCSI disks the host hot-plugged (DiskRootfs with its defaults).
	Rootfs RootfsAssembler
	// MaxContainers bounds the containers the agent keeps.
	MaxContainers int
	// MaxEvents bounds the events waiting for the host's NextEvent; the
	// oldest is dropped when it is full.
	MaxEvents int
	// Freezer freezes the containers' scratch disks for a snapshot; nil
	// means the kernel's (LinuxFreezer).
	Freezer Freezer
	// ShareRoot is where the directory the host shares is mounted,
	// and under which the host puts the sources of the bind mounts it
	// translated; empty means api.ShareRoot.
	ShareRoot string
	// Share mounts that directory the first time a container needs it;
	// nil means virtio-fs (VirtiofsShare).
	Share ShareMounter
	// ShmDir is where the sandbox's shm is mounted the first time a
	// container binds it; empty means api.ShmDir.
	ShmDir string
	// ProcRoot is where procfs is mounted, for the network sysctls of
	// containers in the guest's network namespace; empty means /proc.
	ProcRoot string
}

// Service implements api.AgentService.
type Service struct {
	cfg     Config
	release string
	streams *streamRegistry

	// mu guards procs. A nil entry reserves an id while its process
	// starts.
	mu    sync.Mutex
	procs map[string]*process

	// containers are the containers the OCI runtime runs.
	containers *containerSet
	// freeze holds the containers' filesystems still for a snapshot.
	freeze *fsFreeze
	// net is what ConfigureNetwork keeps between calls.
	net netState
	// share is the host's shared directory, mounted when first needed.
	share *sharedDir
	// shm is the sandbox's /dev/shm, mounted when first needed.
	shm *sandboxShm
	// ports counts the connections DialPort forwards (portfwd.go).
	ports portConns

	// shutdown makes the power-off happen once.
	shutdown sync.Once
	// sessions counts the sessions whose handshake completed.
	sessions atomic.Uint64
}

var _ api.AgentService = (*Service)(nil)

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.System == nil || cfg.Reaper == nil {
		return nil, fmt.Errorf("agent config needs a System and a Reaper: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.MaxProcesses <= 0 {
		cfg.MaxProcesses = DefaultMaxProcesses
	}
	if cfg.StreamTimeout <= 0 {
		cfg.StreamTimeout = DefaultStreamTimeout
	}
	if cfg.OutputDrainIdle <= 0 {
		cfg.OutputDrainIdle = DefaultOutputDrainIdle
	}
	if cfg.ReattachTimeout <= 0 {
		cfg.ReattachTimeout = DefaultReattachTimeout
	}
	if cfg.Freezer == nil {
		cfg.Freezer = LinuxFreezer{}
	}
	if cfg.ShareRoot == "" {
		cfg.ShareRoot = api.ShareRoot
	}
	if cfg.Share == nil {
		cfg.Share = VirtiofsShare{}
	}
	if cfg.ShmDir == "" {
		cfg.ShmDir = api.ShmDir
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = defaultProcRoot
	}
	for what, p := range map[string]string{"share root": cfg.ShareRoot, "shm dir": cfg.ShmDir} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return nil, fmt.Errorf("agent config: %s %q is not a clean absolute path below /: %w", what, p, errdefs.ErrInvalidArgument)
		}
	}
	setContainerDefaults(&cfg)
	var uts unix.Utsname
	release := "unknown"
	if err := unix.Uname(&uts); err == nil {
		release = unix.ByteSliceToString(uts.Release[:])
	}
	return &Service{
		cfg:     cfg,
		release: release,
		// Three stdio streams per possible process may wait at once.
		streams:    newStreamRegistry(cfg.StreamTimeout, 3*cfg.MaxProcesses),
		procs:      make(map[string]*process),
		containers: newContainerSet(cfg),
		freeze:     &fsFreeze{fz: cfg.Freezer},
		share:      newSharedDir(cfg),
		shm:        newSandboxShm(cfg),
	}, nil
}

// Ping reports the agent's version and the guest's state.
func (s *Service) Ping(ctx context.Context, _ *api.PingRequest) (*api.PingResponse, error) {
	return s.info()
}

// info is what Ping answers.
func (s *Service) info() (*api.PingResponse, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return nil, fmt.Errorf("read boot clock: %w", err)
	}
	return &api.PingResponse{
		Version:       Version,
		KernelRelease: s.release,
		UptimeNs:      uint64(ts.Nano()),
		InitNs:        uint64(s.cfg.InitDuration),
	}, nil
}

// SyncGuest sets the clock, credits entropy and sets the hostname. Each
// is attempted; the errors are joined.
func (s *Service) SyncGuest(ctx context.Context, req *api.SyncGuestRequest) (*api.SyncGuestResponse, error) {
	if len(req.Entropy) > MaxEntropy {
		return nil, fmt.Errorf("entropy of %d bytes over %d: %w", len(req.Entropy), MaxEntropy, errdefs.ErrInvalidArgument)
	}
	if len(req.Hostname) > maxHostname || strings.ContainsRune(req.Hostname, 0) {
		return nil, fmt.Errorf("hostname %q: at most %d bytes, no NUL: %w", req.Hostname, maxHostname, errdefs.ErrInvalidArgument)
	}
	if req.WallTimeUnixNs < 0 {
		return nil, fmt.Errorf("wall time %d before 1970: %w", req.WallTimeUnixNs, errdefs.ErrInvalidArgument)
	}
	var errs []error
	if req.WallTimeUnixNs > 0 {
		if err := s.cfg.System.SetWallClock(time.Unix(0, req.WallTimeUnixNs)); err != nil {
			errs = append(errs, fmt.Errorf("set clock: %w", err))
		}
	}
	if len(req.Entropy) > 0 {
		if err := s.cfg.System.AddEntropy(req.Entropy); err != nil {
			errs = append(errs, fmt.Errorf("add entropy: %w", err))
		}
	}
	if req.Hostname != "" {
		if err := s.cfg.System.SetHostname(req.Hostname); err != nil {
			errs = append(errs, fmt.Errorf("set hostname: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	log.G(ctx).WithField("hostname", req.Hostname).Debug("guest synced")
	info, err := s.info()
	if err != nil {
		return nil, err
	}
	return &api.SyncGuestResponse{Guest: info}, nil
}

// shutdownReplyGrace is how long the power-off waits so that the reply to
// Shutdown reaches the host first. ttrpc gives no hook for "reply sent";
// a host that loses the reply sees the VM exit, which is the answer too.
const shutdownReplyGrace = 100 * time.Millisecond

// Shutdown replies, then powers the guest off.
func (s *Service) Shutdown(ctx context.Context, _ *api.ShutdownRequest) (*api.Empty, error) {
	s.shutdown.Do(func() {
		logger := log.G(ctx)
		logger.Info("shutdown requested")
		go func() {
			time.Sleep(shutdownReplyGrace)
			// A frozen scratch disk would hang the unmounts of the
			// power-off.
			if err := s.freeze.thaw(context.WithoutCancel(ctx)); err != nil {
				logger.WithError(err).Warn("thaw filesystems before power off")
			}
			if err := s.cfg.System.PowerOff(); err != nil {
				logger.WithError(err).Error("power off failed")
			}
		}()
	})
	return &api.Empty{}, nil
}
