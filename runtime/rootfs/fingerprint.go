package rootfs

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"os"
	"slices"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// maxLayerDepth bounds how deep a layer's directories may nest. Each level
// of the walk holds a descriptor, and a hostile image could otherwise nest
// without end.
const maxLayerDepth = 1024

// snapshot is a layer's source directory as found by one walk.
type snapshot struct {
	// path is the directory, absolute and clean.
	path string
	// dev and ino identify the directory itself, and ctime (ns) tells it
	// from a later directory that reuses the inode number.
	dev, ino uint64
	ctime    int64
	// sum is the SHA-256 over the metadata of every entry in the tree.
	sum [sha256.Size]byte
	// entries counts the tree's entries, the root included; bytes sums
	// the sizes of its regular files.
	entries, bytes int64
}

// fingerprint walks the tree at path and hashes the metadata of every
// entry: relative path, type and mode, owner, size, modification and change
// times to the nanosecond, inode, link count and device number (of device
// files). The filesystem's own device number is left out: on btrfs or ZFS
// it can change from one boot to the next, which would rebuild every layer
// for nothing. Any write
// to a file or its xattrs changes its ctime, which userspace cannot set, so
// a tree whose fingerprint is unchanged holds what it held (docs/rootfs.md
// says what could still slip through). The walk reads no file content: it
// costs one getdents per directory and one fstatat per entry.
func fingerprint(ctx context.Context, path string) (snapshot, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return snapshot{}, layerPathError(path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return snapshot{}, fmt.Errorf("layer %s: %w", path, err)
	}
	w := &walker{ctx: ctx, h: sha256.New(), root: path}
	w.record(".", &st)
	if err := w.dir(fd, "", 1); err != nil {
		return snapshot{}, err
	}
	s := snapshot{path: path, dev: st.Dev, ino: st.Ino, ctime: st.Ctim.Nano(), entries: w.entries, bytes: w.bytes}
	w.h.Sum(s.sum[:0])
	return s, nil
}

// layerPathError describes a failure to open a layer's directory, mapped to
// errdefs.
func layerPathError(path string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: layer directory %s does not exist", errdefs.ErrNotFound, path)
	case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%w: layer %s is not a directory", errdefs.ErrInvalidArgument, path)
	default:
		return fmt.Errorf("open layer directory %s: %w", path, err)
	}
}

type walker struct {
	ctx     context.Context
	h       hash.Hash
	root    string
	buf     []byte
	entries int64
	bytes   int64
}

// record hashes one entry. Fields are fixed-width and the path is
// length-prefixed, so no two different trees hash the same input.
func (w *walker) record(rel string, st *unix.Stat_t) {
	b := w.buf[:0]
	b = binary.LittleEndian.AppendUint32(b, uint32(len(rel)))
	b = append(b, rel...)
	for _, v := range []uint64{
		uint64(st.Mode), uint64(st.Uid), uint64(st.Gid), uint64(st.Size),
		uint64(st.Mtim.Sec), uint64(st.Mtim.Nsec), uint64(st.Ctim.Sec), uint64(st.Ctim.Nsec),
		st.Ino, uint64(st.Nlink), st.Rdev,
	} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	w.h.Write(b)
	w.buf = b
	w.entries++
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		w.bytes += st.Size
	}
}

// dir hashes the entries of the directory open at fd (relative path rel)
// in name order, then descends into its subdirectories. It closes fd.
func (w *walker) dir(fd int, rel string, depth int) error {
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if depth > maxLayerDepth {
		return fmt.Errorf("%w: layer %s nests directories deeper than %d levels", errdefs.ErrInvalidArgument, w.root, maxLayerDepth)
	}
	if err := w.ctx.Err(); err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("layer %s: read directory %q: %w", w.root, rel, err)
	}
	slices.Sort(names)
	var subdirs []string
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("layer %s: stat %q: %w", w.root, rel+"/"+name, err)
		}
		w.record(rel+"/"+name, &st)
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			subdirs = append(subdirs, name)
		}
	}
	for _, name := range subdirs {
		sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("layer %s: open %q: %w", w.root, rel+"/"+name, err)
		}
		if err := w.dir(sub, rel+"/"+name, depth+1); err != nil {
			return err
		}
	}
	return nil
}
