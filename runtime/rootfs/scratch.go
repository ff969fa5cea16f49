package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// scratchMkfsArgs make the scratch filesystem, measured here at ~22 ms for
// 10 GiB with ~4 MiB allocated:
//
//	-m 0                          no blocks reserved for root: the container's root user is the only user
//	-O ^has_journal               a scratch disk never outlives a crash of its VM (the container is gone
//	                              with it, and a checkpoint freezes the filesystem), so a journal would
//	                              only double metadata writes, which cost most under emulation
//	-E lazy_itable_init=1,...     write no inode tables or journal up front: the file stays sparse
//	-E nodiscard                  nothing to discard in a new sparse file
var scratchMkfsArgs = []string{
	"-q", "-F", "-t", "ext4", "-L", "cocoon-scratch", "-m", "0", "-b", "4096",
	"-O", "^has_journal",
	"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
}

// makeScratch creates the sparse ext4 scratch disk at path, of apparent
// size bytes, holding ScratchUpperDir and ScratchWorkDir. The upperdir is
// a copy of upper (content, owners, modes, xattrs, whiteouts) when upper
// is set, else an empty directory with the root attributes of rootFrom
// (or root-owned 0755). The disk appears at path only once complete, and
// never replaces an existing file.
func makeScratch(ctx context.Context, path string, size int64, upper, rootFrom string) (retErr error) {
	dir := filepath.Dir(path)
	tmpl, err := os.MkdirTemp(dir, ".scratch-tree-")
	if err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	defer os.RemoveAll(tmpl)
	upperTmpl := filepath.Join(tmpl, ScratchUpperDir)
	if upper != "" {
		// cp -a keeps what overlayfs relies on: whiteout devices,
		// trusted.overlay.* xattrs, hard links, owners and modes.
		if err := toolCp.run(ctx, "-a", "--no-target-directory", upper, upperTmpl); err != nil {
			return fmt.Errorf("copy overlay upperdir %s into the scratch disk: %w", upper, err)
		}
	} else if err := mkdirLike(upperTmpl, rootFrom); err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	if err := os.Mkdir(filepath.Join(tmpl, ScratchWorkDir), 0o700); err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}

	f, err := os.CreateTemp(dir, ".scratch-*.ext4")
	if err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if retErr != nil {
			os.Remove(tmp)
		}
	}()
	err = f.Truncate(size)
	err = errors.Join(err, f.Close())
	if err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	args := append(append([]string{}, scratchMkfsArgs...), "-d", tmpl, tmp)
	if err := toolMkfsExt4.run(ctx, args...); err != nil {
		return fmt.Errorf("make scratch filesystem: %w", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%w: scratch disk %s already exists", errdefs.ErrAlreadyExists, path)
		}
		return fmt.Errorf("scratch disk: rename into place: %w", err)
	}
	return nil
}

// mkdirLike makes directory path with the mode, owner and xattrs of from's
// root; with from empty, root-owned and 0755, as containerd makes an
// upperdir.
func mkdirLike(path, from string) error {
	if from == "" {
		if err := os.Mkdir(path, 0o755); err != nil {
			return err
		}
		return os.Chmod(path, 0o755) // past the umask
	}
	var st unix.Stat_t
	if err := unix.Stat(from, &st); err != nil {
		return fmt.Errorf("stat %s: %w", from, err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		return err
	}
	if err := chownMod(path, &st); err != nil {
		return err
	}
	return copyXattrs(from, path, "")
}

// chownMod gives path the owner and mode (set-id bits included) of st.
func chownMod(path string, st *unix.Stat_t) error {
	if err := os.Lchown(path, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	// After chown, which clears set-id bits.
	if err := unix.Chmod(path, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	return nil
}

// copyXattrs copies the extended attributes of from onto to, but those
// whose names start with skip (when not empty).
func copyXattrs(from, to, skip string) error {
	names, err := listXattrs(from)
	if err != nil {
		return err
	}
	for _, name := range names {
		if skip != "" && strings.HasPrefix(name, skip) {
			continue
		}
		val, err := getXattr(from, name)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(to, name, val, 0); err != nil {
			return fmt.Errorf("set xattr %s on %s: %w", name, to, err)
		}
	}
	return nil
}

func listXattrs(path string) ([]string, error) {
	size, err := unix.Llistxattr(path, nil)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
	}
	if size == 0 {
		return nil, nil
	}
	buf := make([]byte, size)
	n, err := unix.Llistxattr(path, buf)
	if err != nil {
		return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
	}
	var names []string
	for start, i := 0, 0; i < n; i++ {
		if buf[i] == 0 {
			if i > start {
				names = append(names, string(buf[start:i]))
			}
			start = i + 1
		}
	}
	return names, nil
}

func getXattr(path, name string) ([]byte, error) {
	size, err := unix.Lgetxattr(path, name, nil)
	if err != nil {
		return nil, fmt.Errorf("get xattr %s of %s: %w", name, path, err)
	}
	buf := make([]byte, size)
	n, err := unix.Lgetxattr(path, name, buf)
	if err != nil {
		return nil, fmt.Errorf("get xattr %s of %s: %w", name, path, err)
	}
	return buf[:n], nil
}

// fillScratch makes the scratch disk at path with fill. On error no file
// is left.
func fillScratch(path string, fill func(*os.File) error) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	err = fill(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("scratch disk: %w", err)
	}
	return nil
}
