package share

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// RemoveAll removes the tree at dir, which may hold mounts: a share's
// binds, a network namespace's file, a container's disk. Every mount at
// or below dir is detached first, deepest first; if one is still there
// afterwards nothing is removed, since removing would go into the mounted
// filesystem: a read-write bind is the user's own directory. A dir that
// does not exist is not an error.
func RemoveAll(dir string) error {
	dir = filepath.Clean(dir)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	if err := UnmountAll(dir); err != nil {
		errs = append(errs, err)
	}
	if left, err := MountsUnder(dir); err != nil || len(left) > 0 {
		return errors.Join(append(errs, err, fmt.Errorf("%s still has mounts (%v): not removed", dir, left))...)
	}
	if err := os.RemoveAll(dir); err != nil {
		return errors.Join(append(errs, err)...)
	}
	return errors.Join(errs...)
}

// UnmountAll detaches every mount at or below dir, deepest first, going
// on past failures.
func UnmountAll(dir string) error {
	points, err := MountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// MountsUnder lists the mount points at or below dir, deepest first.
func MountsUnder(dir string) ([]string, error) {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Clean(dir)))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}
