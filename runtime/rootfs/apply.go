package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// overlayXattrPrefix names overlayfs' own attributes (opaque, origin,
// impure...), which describe the upper layer, not the files.
const overlayXattrPrefix = "trusted.overlay."

// applyUpper replays an overlayfs upper directory onto a plain directory,
// so that dst ends up as the merged view of upper over dst: a whiteout
// removes the entry, an opaque directory replaces the directory, and any
// other entry is created, or replaces what was there, with its content,
// owner, mode, extended attributes (but overlayfs' own) and times; hard
// links within upper stay links. It is what a writable directory root
// would have seen had the container written to it directly, as runc's
// containers do.
func applyUpper(ctx context.Context, upper, dst string) error {
	a := &applier{dst: dst, links: map[fileID]string{}}
	err := filepath.WalkDir(upper, func(src string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, src)
		if err != nil {
			return err
		}
		return a.entry(src, rel)
	})
	if err != nil {
		return fmt.Errorf("apply the writable layer to %s: %w", dst, err)
	}
	// Directories last and deepest first: writing their entries changed
	// their times, and a directory may be made read-only.
	for _, d := range slices.Backward(a.dirs) {
		if err := copyAttrs(d.src, d.dst, &d.st); err != nil {
			return fmt.Errorf("apply the writable layer to %s: %w", dst, err)
		}
	}
	return nil
}

// fileID identifies an inode of the upper directory.
type fileID struct{ dev, ino uint64 }

// applier is one applyUpper.
type applier struct {
	dst string
	// links maps the upper's inodes with several names to the first
	// name they were created under in dst.
	links map[fileID]string
	// dirs are the directories done, in walk order, for their attributes.
	dirs []pendingDir
}

type pendingDir struct {
	src, dst string
	st       unix.Stat_t
}

func (a *applier) entry(src, rel string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	dst := filepath.Join(a.dst, rel)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			// A whiteout: the entry is gone.
			return os.RemoveAll(dst)
		}
	case unix.S_IFDIR:
		if rel != "." {
			if opaque(src) {
				if err := os.RemoveAll(dst); err != nil {
					return err
				}
			}
			var cur unix.Stat_t
			err := unix.Lstat(dst, &cur)
			if err == nil && cur.Mode&unix.S_IFMT != unix.S_IFDIR {
				if err := os.RemoveAll(dst); err != nil {
					return err
				}
				err = unix.ENOENT
			}
			if errors.Is(err, unix.ENOENT) {
				if err := unix.Mkdir(dst, 0o700); err != nil {
					return err
				}
			} else if err != nil {
				return err
			}
		}
		a.dirs = append(a.dirs, pendingDir{src: src, dst: dst, st: st})
		return nil
	}
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	id := fileID{uint64(st.Dev), st.Ino}
	if st.Nlink > 1 {
		if first, ok := a.links[id]; ok {
			return os.Link(first, dst)
		}
		a.links[id] = dst
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := copyContent(src, dst); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
	case unix.S_IFIFO, unix.S_IFCHR, unix.S_IFBLK:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod %s: %w", dst, err)
		}
	default:
		// A socket: nothing to carry over.
		return nil
	}
	return copyAttrs(src, dst, &st)
}

// opaque reports whether overlayfs marked directory dir opaque.
func opaque(dir string) bool {
	buf := make([]byte, 1)
	n, err := unix.Lgetxattr(dir, overlayXattrPrefix+"opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

func copyContent(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// copyAttrs gives dst the owner, mode, extended attributes (but
// overlayfs' own) and times of src, whose stat st is.
func copyAttrs(src, dst string, st *unix.Stat_t) error {
	if err := chownMod(dst, st); err != nil {
		return err
	}
	if err := copyXattrs(src, dst, overlayXattrPrefix); err != nil {
		return err
	}
	times := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(unix.AT_FDCWD, dst, times, unix.AT_SYMLINK_NOFOLLOW)
}
