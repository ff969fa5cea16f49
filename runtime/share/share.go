// Package share is the host side of what a sandbox shares with its guest
// through virtio-fs: its containers' bind mounts. Each bind is made under
// the sandbox's state directory, and one daemon exports the lot.
//
// The layout, after Kata's (which learned it from CVE-2020-28914):
//
//	<state>/mounts   a mount of its own, shared propagation: the binds are
//	                 made here, at mounts/<container>/<index>
//	<state>/shared   a read-only bind of mounts, a slave of it: what the
//	                 daemon exports
//
// A bind made in mounts after the daemon started propagates to shared and
// into the daemon's own mount namespace (virtiofsd's sandbox makes its
// mounts slaves), so containers created later reach the running guest.
// The guest cannot write to shared itself, only into a bind that is
// read-write, and nothing but the binds is under it: a path the spec does
// not grant is not there to reach.
package share

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/oci"
)

const (
	mountsDirName = "mounts"
	sharedDirName = "shared"
)

// Dir is a sandbox's share.
type Dir struct {
	mounts, shared string

	mu sync.Mutex
	// binds are the bind targets of each container, under mounts.
	binds map[string][]string
	// closed: Close ran; nothing is added after it.
	closed bool
}

// New makes the share of the sandbox whose state directory is stateDir.
// On error nothing is left mounted.
func New(stateDir string) (_ *Dir, retErr error) {
	d := &Dir{
		mounts: filepath.Join(stateDir, mountsDirName),
		shared: filepath.Join(stateDir, sharedDirName),
		binds:  make(map[string][]string),
	}
	for _, dir := range []string{d.mounts, d.shared} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, fmt.Errorf("share: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			_ = RemoveAll(d.mounts)
			_ = RemoveAll(d.shared)
		}
	}()
	steps := []struct {
		what                 string
		source, target, kind string
		flags                uintptr
	}{
		// A mount of its own, in a peer group of its own: binds made
		// in it propagate to shared, and to nothing else of the host.
		{"bind the mounts directory", d.mounts, d.mounts, "", unix.MS_BIND},
		{"make it private", "", d.mounts, "", unix.MS_PRIVATE},
		{"make it shared", "", d.mounts, "", unix.MS_SHARED},
		{"bind it to the shared directory", d.mounts, d.shared, "", unix.MS_BIND},
		{"make the shared directory its slave", "", d.shared, "", unix.MS_SLAVE},
		{"make the shared directory read-only", "", d.shared, "", unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV},
	}
	for _, s := range steps {
		if err := unix.Mount(s.source, s.target, s.kind, s.flags, ""); err != nil {
			return nil, fmt.Errorf("share: %s (%s): %w", s.what, s.target, err)
		}
	}
	return d, nil
}

// Root is the directory the daemon exports.
func (d *Dir) Root() string { return d.shared }

// Add makes the binds of a container, at mounts/<containerID>/<index>.
// A source must be a directory or a regular file (after symlinks); a
// read-only bind is made read-only on the host. On error none of the
// container's binds is left.
func (d *Dir) Add(containerID string, binds []oci.Bind) (retErr error) {
	if len(binds) == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("share: the sandbox is stopping: %w", errdefs.ErrUnavailable)
	}
	if _, ok := d.binds[containerID]; ok {
		return fmt.Errorf("share: container %s: %w", containerID, errdefs.ErrAlreadyExists)
	}
	dir := filepath.Join(d.mounts, containerID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("share: container %s: %w", containerID, err)
	}
	var made []string
	defer func() {
		if retErr != nil {
			_ = unmount(made)
			_ = RemoveAll(dir)
		}
	}()
	for _, b := range binds {
		target := filepath.Join(dir, strconv.Itoa(b.Index))
		if err := bind(b, target); err != nil {
			return fmt.Errorf("bind mount %s (from %s): %w", b.Destination, b.Source, err)
		}
		made = append(made, target)
	}
	d.binds[containerID] = made
	return nil
}

// bind mounts b's source at target, which it makes to match the source.
func bind(b oci.Bind, target string) error {
	fi, err := os.Stat(b.Source)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("the source does not exist: %w", errdefs.ErrNotFound)
	case err != nil:
		return err
	case fi.IsDir():
		err = os.Mkdir(target, 0o700)
	case fi.Mode().IsRegular():
		var f *os.File
		if f, err = os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
			err = f.Close()
		}
	default:
		return fmt.Errorf("the source is a %s; only directories and regular files reach the VM (virtio-fs): %w", kind(fi.Mode()), errdefs.ErrNotImplemented)
	}
	if err != nil {
		return err
	}
	// The bind is made detached (open_tree), made read-only if asked,
	// and only then attached: the copy that propagates to shared has
	// the flags it has when attached, and a remount afterwards would
	// leave that copy writable.
	openFlags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC)
	if b.Recursive {
		openFlags |= unix.AT_RECURSIVE
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, b.Source, openFlags)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(fd)
	if b.ReadOnly {
		// The bind's own mount, not its submounts: "ro" is not
		// recursive in runc's (and the kernel's) meaning either.
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
			return fmt.Errorf("make it read-only: %w", err)
		}
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	return nil
}

func kind(m os.FileMode) string {
	switch {
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	case m&os.ModeCharDevice != 0:
		return "character device"
	case m&os.ModeDevice != 0:
		return "block device"
	}
	return "special file"
}

// Remove undoes the binds of a container; one with none is a no-op.
func (d *Dir) Remove(containerID string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	made, ok := d.binds[containerID]
	if !ok {
		return nil
	}
	if err := unmount(made); err != nil {
		return fmt.Errorf("share: container %s: %w", containerID, err)
	}
	delete(d.binds, containerID)
	if err := RemoveAll(filepath.Join(d.mounts, containerID)); err != nil {
		return fmt.Errorf("share: container %s: %w", containerID, err)
	}
	// The copies in shared go with the unmounts (they are slaves);
	// what a daemon still holds is detached with them.
	return RemoveAll(filepath.Join(d.shared, containerID))
}

// Close undoes every bind and the share's own mounts, and removes its
// directories. Run it once the daemon has exited.
func (d *Dir) Close() error {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	return errors.Join(RemoveAll(d.shared), RemoveAll(d.mounts))
}

// unmount detaches each of targets, newest first, going on past failures.
func unmount(targets []string) error {
	var errs []error
	for _, t := range slices.Backward(targets) {
		if err := unix.Unmount(t, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}
