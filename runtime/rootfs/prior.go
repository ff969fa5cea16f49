package rootfs

import (
	"archive/tar"
	"errors"

	"golang.org/x/sys/unix"
)

// priorTree is what the paths of a diff held before the container ran,
// as overlayfs showed them to it: the directory its writable layer was
// seeded from (the upperdir, or a directory root), then the image's
// layers, top-most first. The policy refuses an entry the container
// could not have made, unless the same path held it the same before:
// overlayfs' copy-up keeps owners, modes, device numbers and file
// capabilities whatever the container's capabilities, so the container
// could have left it there under runc too. Paths are looked up without
// following any symlink and never outside the directories.
type priorTree struct {
	// dirs are the directories, top-most first.
	dirs []string
	// fds are their descriptors (O_PATH), opened on the first lookup;
	// -1 for one that could not be opened.
	fds []int
}

func newPriorTree(dirs ...string) *priorTree {
	return &priorTree{dirs: dirs}
}

// close closes the descriptors the lookups opened.
func (t *priorTree) close() {
	for _, fd := range t.fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	t.fds = nil
}

// find returns the stat of what the top-most directory holding name
// held, and that directory's index; ok is false when none held it, when
// a whiteout hid it, or when a symlink or non-directory stood on the way.
func (t *priorTree) find(name string) (st unix.Stat_t, layer int, ok bool) {
	if t == nil {
		return st, 0, false
	}
	if t.fds == nil {
		t.fds = make([]int, len(t.dirs))
		for i, d := range t.dirs {
			fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				fd = -1
			}
			t.fds[i] = fd
		}
	}
	for i, dirfd := range t.fds {
		if dirfd < 0 {
			continue
		}
		fd, err := t.open(i, name, unix.O_PATH)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return st, 0, false
		}
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil || (st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0) {
			return st, 0, false
		}
		return st, i, true
	}
	return st, 0, false
}

// open opens name below directory i without following symlinks.
func (t *priorTree) open(i int, name string, flags uint64) (int, error) {
	how := &unix.OpenHow{
		Flags:   flags | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(t.fds[i], name, how)
		if !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EAGAIN) {
			return fd, err
		}
	}
}

// sameDevice reports whether name was a device node of type typ and the
// same number.
func (t *priorTree) sameDevice(name string, typ byte, major, minor uint32) bool {
	st, _, ok := t.find(name)
	want := uint32(unix.S_IFCHR)
	if typ == tar.TypeBlock {
		want = unix.S_IFBLK
	}
	return ok && st.Mode&unix.S_IFMT == want && st.Rdev == unix.Mkdev(major, minor)
}

// sameOwner reports whether name was owned by uid and gid.
func (t *priorTree) sameOwner(name string, uid, gid uint32) bool {
	st, _, ok := t.find(name)
	return ok && st.Uid == uid && st.Gid == gid
}

// sameSetID reports whether name had the set-id bit bit (0o4000 or
// 0o2000) with the same owner (bit 0o4000) or group (0o2000) id.
func (t *priorTree) sameSetID(name string, bit uint32, id uint32) bool {
	st, _, ok := t.find(name)
	if !ok || st.Mode&bit == 0 {
		return false
	}
	if bit == 0o4000 {
		return st.Uid == id
	}
	return st.Gid == id
}

// sameXattr reports whether name was a regular file with attribute attr
// set to value.
func (t *priorTree) sameXattr(name, attr, value string) bool {
	st, layer, ok := t.find(name)
	if !ok || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	fd, err := t.open(layer, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	buf := make([]byte, len(value)+1)
	n, err := unix.Fgetxattr(fd, attr, buf)
	return err == nil && string(buf[:n]) == value
}
