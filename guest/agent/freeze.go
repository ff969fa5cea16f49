//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/api"
)

// Freezer stops and resumes the writes to a filesystem, for a snapshot of
// the VM and its disks that a guest restored from it finds consistent.
// The agent uses LinuxFreezer; tests pass a fake (tmpfs cannot be
// frozen).
type Freezer interface {
	// Sync writes every filesystem's dirty data to its disk (sync(2)).
	Sync()
	// Freeze flushes the filesystem mounted at path and blocks every
	// write to it until Thaw (FIFREEZE).
	Freeze(path string) error
	// Thaw ends a Freeze (FITHAW); a filesystem that is not frozen is
	// not an error.
	Thaw(path string) error
}

// The ioctls of linux/fs.h, _IOWR('X', 119, int) and _IOWR('X', 120, int)
// in the generic encoding (x86, arm64, riscv); golang.org/x/sys has
// neither.
const (
	ioctlFIFREEZE = 0xc0045877
	ioctlFITHAW   = 0xc0045878
)

// LinuxFreezer is the Freezer of a real guest.
type LinuxFreezer struct{}

var _ Freezer = LinuxFreezer{}

// Sync calls sync(2).
func (LinuxFreezer) Sync() { unix.Sync() }

// Freeze issues FIFREEZE on the mount point.
func (LinuxFreezer) Freeze(path string) error {
	return fsIoctl(path, ioctlFIFREEZE, "FIFREEZE")
}

// Thaw issues FITHAW on the mount point; EINVAL (not frozen) is success.
func (LinuxFreezer) Thaw(path string) error {
	err := fsIoctl(path, ioctlFITHAW, "FITHAW")
	if errors.Is(err, unix.EINVAL) {
		return nil
	}
	return err
}

func fsIoctl(path string, req uint, name string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := sc.Control(func(fd uintptr) {
		// The argument is ignored by both ioctls.
		ioErr = unix.IoctlSetInt(int(fd), req, 0)
	}); err != nil {
		return err
	}
	if ioErr != nil {
		return fmt.Errorf("%s %s: %w", name, path, ioErr)
	}
	return nil
}

// freezeState says whether the containers' filesystems are frozen.
type freezeState int

const (
	// thawed: writes go through; containers come and go.
	thawed freezeState = iota
	// freezing: a FreezeFilesystems is under way.
	freezing
	// frozen: the filesystems in fsFreeze.frozen are frozen.
	frozen
)

// errFrozen is the refusal of a call that would mount, unmount or read a
// container's writable layer while the filesystems are frozen: a mount
// or unmount would hang on the freeze, or the snapshot would miss it.
func errFrozen(what string) error {
	return fmt.Errorf("%s: filesystems are frozen for a snapshot (thaw them first): %w", what, errdefs.ErrFailedPrecondition)
}

// fsFreeze freezes the containers' scratch disks for a snapshot and keeps
// what it froze, in the agent's memory: a guest restored from a snapshot
// taken while frozen resumes frozen, and its ThawFilesystems thaws the
// same set. Calls that change the set of mounted scratch disks (create,
// delete) or read one (export) run between enter and leave; a freeze is
// refused while one runs, and they are refused while frozen.
type fsFreeze struct {
	fz Freezer

	// opMu serializes freezes and thaws; it is held across the ioctls
	// (and so a sync), never across anything else.
	opMu sync.Mutex

	// mu guards state, frozen and busy; never held across an ioctl.
	mu    sync.Mutex
	state freezeState
	// frozen are the mount points frozen, in the order they were.
	frozen []string
	// busy counts the calls between enter and leave.
	busy int
}

// enter admits a call that mounts, unmounts or reads a container's
// writable layer, or refuses it while the filesystems are frozen (what
// says, to a user, what cannot be done). An admitted call must leave.
func (f *fsFreeze) enter(what string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state != thawed {
		return errFrozen(what)
	}
	f.busy++
	return nil
}

// leave ends a call that entered.
func (f *fsFreeze) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.busy--
}

// freeze syncs and freezes the filesystems mounts returns, and returns
// how many are frozen. Frozen already, it does nothing. If one cannot be
// frozen, those that were are thawed again.
func (f *fsFreeze) freeze(ctx context.Context, mounts func() []string) (int, error) {
	f.opMu.Lock()
	defer f.opMu.Unlock()
	f.mu.Lock()
	switch {
	case f.state == frozen:
		n := len(f.frozen)
		f.mu.Unlock()
		return n, nil
	case f.busy > 0:
		f.mu.Unlock()
		return 0, fmt.Errorf("a container is being created, deleted or exported; freeze once that is done: %w", errdefs.ErrFailedPrecondition)
	}
	f.state = freezing
	f.mu.Unlock()

	// Nothing enters while freezing: the containers and their mounts
	// stay as listed.
	list := mounts()
	f.fz.Sync()
	var done []string
	var err error
	for _, m := range list {
		if err = f.fz.Freeze(m); err != nil {
			err = fmt.Errorf("freeze the scratch disk at %s: %w", m, err)
			break
		}
		done = append(done, m)
	}
	if err != nil {
		for _, m := range slices.Backward(done) {
			if terr := f.fz.Thaw(m); terr != nil {
				// Left frozen, it would hang its container's
				// writers: say so, loudly.
				log.G(ctx).WithError(terr).WithField("mount", m).Error("thaw after a failed freeze")
				err = errors.Join(err, fmt.Errorf("thaw the scratch disk at %s again: %w", m, terr))
			}
		}
		f.mu.Lock()
		f.state = thawed
		f.mu.Unlock()
		return 0, err
	}
	f.mu.Lock()
	f.state, f.frozen = frozen, done
	f.mu.Unlock()
	log.G(ctx).WithField("frozen", len(done)).Info("filesystems frozen")
	return len(done), nil
}

// thaw thaws what freeze froze. Those that fail stay frozen, and the
// guest with them, for another thaw to retry; without a freeze it does
// nothing.
func (f *fsFreeze) thaw(ctx context.Context) error {
	f.opMu.Lock()
	defer f.opMu.Unlock()
	f.mu.Lock()
	if f.state != frozen {
		f.mu.Unlock()
		return nil
	}
	list := f.frozen
	f.mu.Unlock()

	var failed []string
	var errs []error
	for _, m := range list {
		if err := f.fz.Thaw(m); err != nil {
			failed = append(failed, m)
			errs = append(errs, fmt.Errorf("thaw the scratch disk at %s: %w", m, err))
		}
	}
	f.mu.Lock()
	if len(failed) == 0 {
		f.state, f.frozen = thawed, nil
	} else {
		f.frozen = failed
	}
	f.mu.Unlock()
	if len(failed) == 0 {
		log.G(ctx).WithField("thawed", len(list)).Info("filesystems thawed")
	}
	return errors.Join(errs...)
}

// scratchMounts lists the mount points of the containers' scratch disks.
func (cs *containerSet) scratchMounts() []string {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var out []string
	for _, c := range cs.byID {
		if c != nil && c.rootfs != nil && c.rootfs.Scratch != "" {
			out = append(out, c.rootfs.Scratch)
		}
	}
	slices.Sort(out)
	return out
}

// FreezeFilesystems syncs the guest and freezes every container's
// scratch disk for a snapshot.
func (s *Service) FreezeFilesystems(ctx context.Context, _ *api.Empty) (*api.FreezeFilesystemsResponse, error) {
	n, err := s.freeze.freeze(ctx, s.containers.scratchMounts)
	if err != nil {
		return nil, err
	}
	return &api.FreezeFilesystemsResponse{Frozen: uint32(n)}, nil
}

// ThawFilesystems thaws what FreezeFilesystems froze.
func (s *Service) ThawFilesystems(ctx context.Context, _ *api.Empty) (*api.Empty, error) {
	if err := s.freeze.thaw(ctx); err != nil {
		return nil, err
	}
	return &api.Empty{}, nil
}
