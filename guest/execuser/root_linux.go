//go:build linux

package execuser

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// rootFS is a root filesystem opened for provisioning or lookups. Every
// path is resolved inside it, as if it were "/": a symlink in it, even an
// absolute one or one climbing with "..", never leads out of it, and a
// magic link (/proc/self/root and the like) is refused.
type rootFS struct {
	path string // as the caller named it, for errors
	fd   int    // O_PATH descriptor of the root directory
}

// openRoot opens the root filesystem at path.
func openRoot(path string) (*rootFS, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &pathError{op: "open root", path: path, err: err}
	}
	return &rootFS{path: path, fd: fd}, nil
}

// close closes the root's descriptor.
func (r *rootFS) close() {
	unix.Close(r.fd)
}

// pathError is an error about a path inside the root filesystem.
type pathError struct {
	op, path string
	err      error
}

func (e *pathError) Error() string { return e.path + ": " + e.op + ": " + e.err.Error() }

// Unwrap returns the cause and, when the path could not be resolved inside
// the root (a magic link, too many symlinks, an escape), ErrUnsafe.
func (e *pathError) Unwrap() []error {
	if errors.Is(e.err, unix.ELOOP) || errors.Is(e.err, unix.EXDEV) {
		return []error{e.err, ErrUnsafe}
	}
	return []error{e.err}
}

// unsafeError is the error for path, which is not what may be
// rewritten: what says what it is instead.
func unsafeError(path, what string) error {
	return fmt.Errorf("%s %s: %w", path, what, ErrUnsafe)
}

// openat2 is unix.Openat2, retried when interrupted or when the kernel
// saw a rename race it could not rule out.
func openat2(dirfd int, name string, how *unix.OpenHow) (int, error) {
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, name, how)
		if (err == unix.EINTR || err == unix.EAGAIN) && i < 64 {
			continue
		}
		return fd, err
	}
}

// open resolves p, a path in the root (absolute or not, it is relative to
// the root), and opens it with flags. Symlinks are followed inside the
// root; with O_NOFOLLOW in flags the last one is not.
func (r *rootFS) open(p string, flags uint64) (int, error) {
	fd, err := openat2(r.fd, relative(p), &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, err
	}
	return fd, nil
}

// relative is p relative to the root.
func relative(p string) string {
	p = strings.TrimLeft(filepath.Clean("/"+p), "/")
	if p == "" {
		return "."
	}
	return p
}

// openChild opens name, one component, in directory dirfd without
// following any symlink.
func openChild(dirfd int, name string, flags uint64) (int, error) {
	return openat2(dirfd, name, &unix.OpenHow{
		Flags:   flags | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// openDir opens the directory p of the root for reading and syncing; it
// returns -1 and no error when p does not exist.
func (r *rootFS) openDir(p string) (int, error) {
	fd, err := r.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) {
		return -1, nil
	}
	if err != nil {
		return -1, &pathError{op: "open directory", path: p, err: err}
	}
	return fd, nil
}

// exists reports whether p resolves to something in the root, and its
// stat if so. A symlink that leads nowhere does not exist.
func (r *rootFS) exists(p string) (bool, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := r.open(p, unix.O_PATH)
	if errors.Is(err, unix.ENOENT) {
		return false, st, nil
	}
	if err != nil {
		return false, st, &pathError{op: "look up", path: p, err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return false, st, &pathError{op: "stat", path: p, err: err}
	}
	return true, st, nil
}

// mkdirAll makes directory p of the root and whichever of its parents
// are missing: parents 0755 root:root, p itself mode and uid:gid. It
// reports whether it made p; p existing (even as a symlink that leads
// nowhere) is no error. Owners and modes are set on descriptors of the
// directories just made, never by path, and whatever the umask.
func (r *rootFS) mkdirAll(p string, mode uint32, uid, gid int) (bool, error) {
	comps := strings.Split(relative(p), "/")
	if comps[0] == "." {
		return false, nil
	}
	parent := r.fd
	defer func() {
		if parent != r.fd {
			unix.Close(parent)
		}
	}()
	for i, name := range comps {
		sub := "/" + strings.Join(comps[:i+1], "/")
		last := i == len(comps)-1
		fd, err := r.open(sub, unix.O_PATH|unix.O_DIRECTORY)
		if err == nil {
			if last {
				unix.Close(fd)
				return false, nil
			}
			if parent != r.fd {
				unix.Close(parent)
			}
			parent = fd
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return false, &pathError{op: "look up", path: sub, err: err}
		}
		if err := unix.Mkdirat(parent, name, 0o700); err != nil {
			if errors.Is(err, unix.EEXIST) {
				if last {
					return false, nil
				}
				return false, fmt.Errorf("%s is there but leads nowhere (a dangling symlink?)", sub)
			}
			return false, &pathError{op: "make directory", path: sub, err: err}
		}
		m, o, g := uint32(0o755), 0, 0
		if last {
			m, o, g = mode, uid, gid
		}
		fd, err = openChild(parent, name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return false, &pathError{op: "open new directory", path: sub, err: err}
		}
		if parent != r.fd {
			unix.Close(parent)
		}
		parent = fd
		if err := unix.Fchown(fd, o, g); err != nil {
			return false, &pathError{op: "chown", path: sub, err: err}
		}
		if err := unix.Fchmod(fd, m); err != nil {
			return false, &pathError{op: "chmod", path: sub, err: err}
		}
	}
	return true, nil
}
