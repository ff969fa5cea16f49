package rootfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// maxTrailer bounds what may follow the end of a diff's tar: zeros only
// (tar writers may pad to a record size).
const maxTrailer = 64 << 10

// applyDiff applies the diff read from in onto dir with containerd's
// archive.Apply, through f: whiteouts become overlayfs' when overlay is
// set (dir is an upperdir), else they delete. archive.Apply resolves
// every name, and every hard link's target, inside dir. Only zeros may
// follow the tar.
func applyDiff(ctx context.Context, dir string, in io.Reader, f *diffFilter, overlay bool) error {
	opts := []archive.ApplyOpt{archive.WithFilter(f.accept)}
	if overlay {
		opts = append(opts, archive.WithConvertWhiteout(archive.OverlayConvertWhiteout))
	}
	if _, err := archive.Apply(ctx, dir, in, opts...); err != nil {
		return err
	}
	return readTrailer(in)
}

// readTrailer reads what follows the tar, which must be zeros, at most
// maxTrailer of them.
func readTrailer(in io.Reader) error {
	buf := make([]byte, 4<<10)
	total := 0
	for {
		n, err := in.Read(buf)
		for _, b := range buf[:n] {
			if b != 0 {
				return fmt.Errorf("data after the end of the diff: %w", errdefs.ErrDataLoss)
			}
		}
		total += n
		if total > maxTrailer {
			return fmt.Errorf("more than %d bytes after the end of the diff: %w", maxTrailer, errdefs.ErrDataLoss)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// setRootAttrs gives directory dir the owner, mode, extended attributes
// and modification time of the diff's root entry hdr (already through the
// policy), which archive.Apply leaves alone. Without one it takes the
// owner and mode of directory from, if set: overlayfs shows the
// upperdir's for the container's root.
func setRootAttrs(dir string, hdr *tar.Header, from string) error {
	if hdr == nil {
		if from == "" {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Stat(from, &st); err != nil {
			return fmt.Errorf("stat %s: %w", from, err)
		}
		return chownMod(dir, &st)
	}
	if err := os.Lchown(dir, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := unix.Chmod(dir, uint32(hdr.Mode&0o7777)); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	for key, value := range hdr.PAXRecords {
		if attr, ok := strings.CutPrefix(key, paxXattr); ok {
			if err := unix.Lsetxattr(dir, attr, []byte(value), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
				return fmt.Errorf("set xattr %s on %s: %w", attr, dir, err)
			}
		}
	}
	mtime := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	return unix.UtimesNanoAt(unix.AT_FDCWD, dir, []unix.Timespec{mtime, mtime}, unix.AT_SYMLINK_NOFOLLOW)
}
