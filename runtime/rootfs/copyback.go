package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// Suffixes of the directories CopyBack makes next to an upperdir.
const (
	copyBackNew = ".cocoon-new"
	copyBackOld = ".cocoon-old"
)

// CopyBack puts what a container wrote on its scratch disk back where it
// would have gone had the container written to the host directly, as
// runc's containers do:
//
//   - For a root on a snapshot, the overlay upperdir that the disk was
//     seeded from is made to hold what the disk's upper/ holds now: the
//     writes, whiteouts and opaque directories, in overlayfs' own format,
//     which is the host upperdir's format too. upper/ is copied (cp -a)
//     next to the upperdir, which is then swapped in by two renames, so
//     that a failed copy leaves the upperdir as it was.
//   - For a writable directory root (ctr run --rootfs), upper/ is applied
//     onto the directory: whiteouts delete, opaque directories replace,
//     the rest is written over (applyUpper).
//
// Then a stopped container started again on the same root (docker start,
// nerdctl start) finds its writes, and a commit or diff of the snapshot
// sees them. The disk must no longer be in use: its VM has unmounted it,
// or has synced it and ended. It is loop-mounted read-only under r.Dir. A
// read-only root has nothing to give back.
func (c *Cache) CopyBack(ctx context.Context, r Rootfs) (retErr error) {
	if r.Scratch == "" || (r.Upper == "" && r.Bind == "") {
		return nil
	}
	mnt, err := os.MkdirTemp(r.Dir, ".scratch-ro-")
	if err != nil {
		return fmt.Errorf("copy back: %w", err)
	}
	defer os.Remove(mnt)
	// mount(8) sets up the loop device and has it cleared on unmount.
	if err := toolMount.run(ctx, "-t", ScratchFSType, "-o", "loop,ro,noatime", r.Scratch, mnt); err != nil {
		return fmt.Errorf("copy back: mount the scratch disk: %w", err)
	}
	defer func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("copy back: unmount the scratch disk: %w", err))
		}
	}()
	upper := filepath.Join(mnt, ScratchUpperDir)
	if r.Upper == "" {
		return applyUpper(ctx, upper, r.Bind)
	}
	return replaceUpper(ctx, upper, r.Upper)
}

// replaceUpper makes the directory upper a copy of from, by a copy next
// to it and two renames.
func replaceUpper(ctx context.Context, from, upper string) error {
	staged, old := upper+copyBackNew, upper+copyBackOld
	for _, p := range []string{staged, old} {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("copy back: remove leftover %s: %w", p, err)
		}
	}
	if err := toolCp.run(ctx, "-a", "--no-target-directory", from, staged); err != nil {
		os.RemoveAll(staged)
		return fmt.Errorf("copy back the writable layer into %s: %w", upper, err)
	}
	if err := os.Rename(upper, old); err != nil {
		os.RemoveAll(staged)
		return fmt.Errorf("copy back: %w", err)
	}
	if err := os.Rename(staged, upper); err != nil {
		if rerr := os.Rename(old, upper); rerr != nil {
			log.G(ctx).WithError(rerr).WithField("upperdir", upper).Error("copy back: cannot put the upperdir back")
		}
		os.RemoveAll(staged)
		return fmt.Errorf("copy back: %w", err)
	}
	if err := os.RemoveAll(old); err != nil {
		log.G(ctx).WithError(err).WithField("dir", old).Warn("copy back: remove the old upperdir")
	}
	return nil
}
