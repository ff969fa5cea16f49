//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/api"
)

// ShareMounter mounts the directory the host shares with the guest.
// The agent uses VirtiofsShare; tests pass one that mounts a directory of
// their own.
type ShareMounter interface {
	// MountShare mounts the host's shared directory on dir, an empty
	// directory.
	MountShare(dir string) error
}

// VirtiofsShare is the ShareMounter of a real guest: the virtio-fs device
// tagged api.ShareTag, which the host adds to a sandbox whose containers
// bind-mount host directories.
type VirtiofsShare struct{}

var _ ShareMounter = VirtiofsShare{}

// MountShare mounts the share without device nodes or set-id programs:
// the host's files are data to the guest.
func (VirtiofsShare) MountShare(dir string) error {
	return unix.Mount(api.ShareTag, dir, "virtiofs", unix.MS_NODEV|unix.MS_NOSUID, "")
}

// sharedDir is the host's shared directory in the guest. The host writes
// each bind mount of a container that comes from the host as a bind mount
// whose source is under root; the share is mounted there the first time
// a container has one, and stays for the guest's life. It is a mount of
// its own, not a container's scratch disk, so FreezeFilesystems never
// freezes it (a guest with a share is not snapshotted), and it is not in
// any writable layer, so no export holds it: the OCI runtime binds it
// into the container's own mount namespace only.
type sharedDir struct {
	root string
	m    ShareMounter
	once onceMount
}

func newSharedDir(cfg Config) *sharedDir {
	return &sharedDir{root: cfg.ShareRoot, m: cfg.Share}
}

// onceMount mounts something on a directory the first time it is
// needed, and remembers it for the guest's life.
type onceMount struct {
	// mu guards mounted; it is held across the mount, so that a second
	// container waits for the first one's mount rather than mounting
	// again.
	mu      sync.Mutex
	mounted bool
}

// do makes dir (and its parent) if needed and calls mount on it, unless
// an earlier call did. what names the mount in errors and the log.
func (o *onceMount) do(ctx context.Context, dir, what string, mount func(dir string) error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mounted {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	// The mount's root hides the directory's mode; 0700 keeps the mount
	// point itself to root while nothing is mounted on it.
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := mount(dir); err != nil {
		return err
	}
	o.mounted = true
	log.G(ctx).WithField("path", dir).Info(what + " mounted")
	return nil
}

// under says whether source is root or in it.
func (d *sharedDir) under(source string) bool {
	if !path.IsAbs(source) {
		return false
	}
	source = path.Clean(source)
	return source == d.root || strings.HasPrefix(source, d.root+"/")
}

// prepare makes the share ready for container id's spec: if a bind mount
// of it comes from the share, the share is mounted and each such source
// must be in it. A source the share does not hold is the host's mistake,
// refused with errdefs.ErrInvalidArgument; a share that cannot be mounted
// fails with errdefs.ErrFailedPrecondition.
func (d *sharedDir) prepare(ctx context.Context, id string, spec *bundleSpec) error {
	binds, err := spec.bindMounts()
	if err != nil {
		return fmt.Errorf("container %s: mounts: %w: %v", id, errdefs.ErrInvalidArgument, err)
	}
	var shared []bindMount
	for _, b := range binds {
		if d.under(b.Source) {
			shared = append(shared, b)
		}
	}
	if len(shared) == 0 {
		return nil
	}
	if err := d.mount(ctx); err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	for _, b := range shared {
		if _, err := os.Stat(b.Source); err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return fmt.Errorf("container %s: bind mount on %s: its source %s is not in the directory the host shares (%v): %w",
				id, b.Destination, b.Source, err, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// mount mounts the share on root once.
func (d *sharedDir) mount(ctx context.Context) error {
	return d.once.do(ctx, d.root, "the host's shared directory", func(dir string) error {
		if err := d.m.MountShare(dir); err != nil {
			return fmt.Errorf("mount the directory the host shares (virtio-fs tag %s) on %s: %w: %w",
				api.ShareTag, dir, errdefs.ErrFailedPrecondition, err)
		}
		return nil
	})
}
