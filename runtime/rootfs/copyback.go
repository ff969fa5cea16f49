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

// CopyBack makes the overlay upperdir that r's scratch disk was seeded
// from hold what the disk's upper/ holds now: what the container wrote,
// its whiteouts and opaque directories, in overlayfs' own format, which is
// the format of the host's upperdir too. Then a stopped container started
// again on the same snapshot (docker start, nerdctl start) finds its
// writes, and a commit or diff of the snapshot sees them, as with runc.
//
// The disk must no longer be in use: its VM has unmounted it, or has
// synced it and ended. It is loop-mounted read-only under r.Dir; upper/
// is copied (cp -a) next to the upperdir, which is then swapped in by two
// renames, so that a failed copy leaves the upperdir as it was. Without an
// upperdir (a read-only root, a writable bind directory) there is nothing
// to do.
func (c *Cache) CopyBack(ctx context.Context, r Rootfs) (retErr error) {
	if r.Upper == "" || r.Scratch == "" {
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

	staged, old := r.Upper+copyBackNew, r.Upper+copyBackOld
	for _, p := range []string{staged, old} {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("copy back: remove leftover %s: %w", p, err)
		}
	}
	if err := toolCp.run(ctx, "-a", "--no-target-directory", filepath.Join(mnt, ScratchUpperDir), staged); err != nil {
		os.RemoveAll(staged)
		return fmt.Errorf("copy back the writable layer into %s: %w", r.Upper, err)
	}
	if err := os.Rename(r.Upper, old); err != nil {
		os.RemoveAll(staged)
		return fmt.Errorf("copy back: %w", err)
	}
	if err := os.Rename(staged, r.Upper); err != nil {
		if rerr := os.Rename(old, r.Upper); rerr != nil {
			log.G(ctx).WithError(rerr).WithField("upperdir", r.Upper).Error("copy back: cannot put the upperdir back")
		}
		os.RemoveAll(staged)
		return fmt.Errorf("copy back: %w", err)
	}
	if err := os.RemoveAll(old); err != nil {
		log.G(ctx).WithError(err).WithField("dir", old).Warn("copy back: remove the old upperdir")
	}
	return nil
}
