//go:build linux

package execuser

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// maxFileSize is the largest file Provision or a lookup reads.
const maxFileSize = 64 << 20

// file is a file as read: whether it exists, its content and its stat.
type file struct {
	exists bool
	data   []byte
	st     unix.Stat_t
}

// mode is the file's permission bits.
func (f *file) mode() uint32 { return f.st.Mode & 0o7777 }

// readChild reads name, one component, in directory dirfd, without
// following a symlink; path names it in errors. A missing file is no
// error; a symlink or anything but a regular file is ErrUnsafe.
func readChild(dirfd int, name, path string) (file, error) {
	return readFile(path, func(flags uint64) (int, error) {
		return openChild(dirfd, name, flags)
	})
}

// readResolved reads p, resolved in the root the way a process in it
// would open it (symlinks followed, inside the root). A missing file is
// no error; anything but a regular file is ErrUnsafe.
func (r *rootFS) readResolved(p string) (file, error) {
	return readFile(p, func(flags uint64) (int, error) {
		return r.open(p, flags)
	})
}

// readFile reads the regular file open opens. It looks at what it is
// before opening it for reading, so that a device or a FIFO is never
// opened.
func readFile(path string, open func(flags uint64) (int, error)) (file, error) {
	var f file
	pfd, err := open(unix.O_PATH)
	if errors.Is(err, unix.ENOENT) {
		return f, nil
	}
	if err != nil {
		return f, &pathError{op: "open", path: path, err: err}
	}
	err = unix.Fstat(pfd, &f.st)
	unix.Close(pfd)
	if err != nil {
		return f, &pathError{op: "stat", path: path, err: err}
	}
	if err := checkRegular(path, &f.st); err != nil {
		return f, err
	}
	fd, err := open(unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY)
	if err != nil {
		return f, &pathError{op: "open", path: path, err: err}
	}
	osf := os.NewFile(uintptr(fd), path)
	defer osf.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return f, &pathError{op: "stat", path: path, err: err}
	}
	if st.Dev != f.st.Dev || st.Ino != f.st.Ino {
		return f, fmt.Errorf("%s was replaced while being opened", path)
	}
	f.data, err = io.ReadAll(io.LimitReader(osf, maxFileSize+1))
	if err != nil {
		return f, &pathError{op: "read", path: path, err: err}
	}
	if len(f.data) > maxFileSize {
		return f, fmt.Errorf("%s is larger than %d bytes", path, maxFileSize)
	}
	f.exists = true
	return f, nil
}

// checkRegular returns ErrUnsafe unless st is a regular file's.
func checkRegular(path string, st *unix.Stat_t) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return nil
	case unix.S_IFLNK:
		return unsafeError(path, "is a symlink")
	case unix.S_IFDIR:
		return unsafeError(path, "is a directory")
	default:
		return unsafeError(path, "is not a regular file")
	}
}

// replaceChild replaces name in directory dirfd with a file holding data,
// mode and uid:gid, atomically: it writes a temporary file next to it,
// syncs it and renames it over name, then syncs the directory. prev is
// what was read of name: the replacement is refused when name is no longer
// that file (or, if prev does not exist, when something is there now).
// path names the file in errors. The temporary file never survives an
// error.
func replaceChild(dirfd int, name, path string, data []byte, prev file, mode uint32, uid, gid int) error {
	tmp, fd, err := createTemp(dirfd, name)
	if err != nil {
		return &pathError{op: "create temporary file", path: path, err: err}
	}
	renamed := false
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
		if !renamed {
			unix.Unlinkat(dirfd, tmp, 0)
		}
	}()
	if err := writeAll(fd, data); err != nil {
		return &pathError{op: "write " + tmp, path: path, err: err}
	}
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return &pathError{op: "chown " + tmp, path: path, err: err}
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return &pathError{op: "chmod " + tmp, path: path, err: err}
	}
	err = unix.Close(fd)
	fd = -1
	if err != nil {
		return &pathError{op: "close " + tmp, path: path, err: err}
	}
	if err := unchanged(dirfd, name, path, prev); err != nil {
		return err
	}
	if prev.exists {
		err = unix.Renameat(dirfd, tmp, dirfd, name)
	} else {
		err = unix.Renameat2(dirfd, tmp, dirfd, name, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EINVAL) {
			err = unix.Renameat(dirfd, tmp, dirfd, name)
		}
	}
	if err != nil {
		return &pathError{op: "rename " + tmp + " over it", path: path, err: err}
	}
	renamed = true
	return nil
}

// createTemp creates a temporary file for name in dirfd, mode 0600, and
// returns its name and descriptor.
func createTemp(dirfd int, name string) (string, int, error) {
	for i := 0; ; i++ {
		var b [8]byte
		rand.Read(b[:])
		tmp := "." + name + "." + hex.EncodeToString(b[:])
		fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) && i < 16 {
			continue
		}
		if err != nil {
			return "", -1, err
		}
		return tmp, fd, nil
	}
}

// writeAll writes data to fd.
func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// unchanged returns an error when name in dirfd is no longer prev: not
// there or changed in any way, or there at all when prev does not exist.
// It is ErrUnsafe when name is now a symlink or not a regular file.
func unchanged(dirfd int, name, path string, prev file) error {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case errors.Is(err, unix.ENOENT) && !prev.exists:
		return nil
	case err != nil && !errors.Is(err, unix.ENOENT):
		return &pathError{op: "stat", path: path, err: err}
	case !prev.exists:
		if err := checkRegular(path, &st); err != nil {
			return err
		}
		return fmt.Errorf("%s appeared while being written", path)
	case err != nil:
		return fmt.Errorf("%s disappeared while being rewritten", path)
	}
	if err := checkRegular(path, &st); err != nil {
		return err
	}
	if st.Dev != prev.st.Dev || st.Ino != prev.st.Ino || st.Size != prev.st.Size ||
		st.Mtim != prev.st.Mtim || st.Ctim != prev.st.Ctim {
		return fmt.Errorf("%s changed while being rewritten", path)
	}
	return nil
}

// removeChild removes the regular file name from directory dirfd and
// reports whether it was there; path names it in errors. Anything but a
// regular file is left and is ErrUnsafe.
func removeChild(dirfd int, name, path string) (bool, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, &pathError{op: "stat", path: path, err: err}
	}
	if err := checkRegular(path, &st); err != nil {
		return false, err
	}
	if err := unix.Unlinkat(dirfd, name, 0); err != nil {
		return false, &pathError{op: "remove", path: path, err: err}
	}
	return true, nil
}
