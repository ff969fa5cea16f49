package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Verify reads the manifest of dir (ReadManifest) and checks every file it
// lists: present as a regular file, not a symlink, of the listed size and
// sha256. Files the manifest does not list are ignored, and nothing of
// this package ever opens them. Every refusal wraps ErrInvalid.
func Verify(dir string) (*Manifest, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	for _, f := range m.Files {
		if err := verifyFile(dir, f); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// VerifyFile checks one file that m, read from dir by ReadManifest,
// lists, as Verify checks each: for a caller that verifies the files it
// needs first and the largest while it prepares the rest, and uses none
// before its check passed. A name m does not list is refused.
func VerifyFile(dir string, m *Manifest, name string) error {
	f, ok := m.file(name)
	if !ok {
		return invalidf(dir, "file %q is not listed in the manifest", name)
	}
	return verifyFile(dir, f)
}

// verifyFile checks one listed file's size and digest.
func verifyFile(dir string, want File) error {
	f, size, err := openRegular(dir, want.Name)
	if err != nil {
		return err
	}
	defer f.Close()
	if size != want.Size {
		return invalidf(dir, "file %q is %d bytes, the manifest says %d", want.Name, size, want.Size)
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, want.Size+1))
	if err != nil {
		return fmt.Errorf("checkpoint %s: read file %q: %w", dir, want.Name, err)
	}
	if n != want.Size {
		return invalidf(dir, "file %q changed size while it was read (%d bytes, the manifest says %d)", want.Name, n, want.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want.SHA256 {
		return invalidf(dir, "file %q: sha256 is %s, the manifest says %s", want.Name, got, want.SHA256)
	}
	return nil
}

// Open opens, read-only, the file name of checkpoint dir that m lists:
// never a symlink, never anything but a regular file in dir, and only if
// it still has the listed size (Verify checked its content). A name the
// manifest does not list is errdefs.ErrNotFound.
func Open(dir string, m *Manifest, name string) (*os.File, error) {
	if err := ValidName(name); err != nil {
		return nil, fmt.Errorf("checkpoint %s: open file %w", dir, err)
	}
	listed, ok := m.file(name)
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: file %q is not listed in the manifest: %w", dir, name, errdefs.ErrNotFound)
	}
	f, size, err := openRegular(dir, name)
	if err != nil {
		return nil, err
	}
	if size != listed.Size {
		f.Close()
		return nil, invalidf(dir, "file %q is %d bytes, the manifest says %d", name, size, listed.Size)
	}
	return f, nil
}

// openRegular opens dir/name read-only if it is a regular file, and
// returns its size. The name must already be a plain one. The file is
// looked at before it is opened, and opened without following a symlink
// and without blocking, so that a FIFO or a device node in an extracted
// tar is refused and never opened for real; what was opened is then
// checked to be what was looked at.
func openRegular(dir, name string) (*os.File, int64, error) {
	p := filepath.Join(dir, name)
	var lst unix.Stat_t
	if err := unix.Lstat(p, &lst); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, 0, invalidf(dir, "file %q is missing", name)
		}
		return nil, 0, fmt.Errorf("checkpoint %s: file %q: %w", dir, name, err)
	}
	if err := checkRegular(dir, name, lst.Mode); err != nil {
		return nil, 0, err
	}
	var fd int
	for {
		var err error
		fd, err = unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err == nil {
			break
		}
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ELOOP):
			return nil, 0, invalidf(dir, "file %q is a symlink", name)
		case errors.Is(err, unix.ENOENT):
			return nil, 0, invalidf(dir, "file %q is missing", name)
		}
		return nil, 0, fmt.Errorf("checkpoint %s: open file %q: %w", dir, name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("checkpoint %s: stat file %q: %w", dir, name, err)
	}
	if err := checkRegular(dir, name, st.Mode); err != nil {
		unix.Close(fd)
		return nil, 0, err
	}
	if st.Dev != lst.Dev || st.Ino != lst.Ino {
		unix.Close(fd)
		return nil, 0, invalidf(dir, "file %q was replaced while it was opened", name)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("checkpoint %s: file %q: %w", dir, name, err)
	}
	return os.NewFile(uintptr(fd), p), st.Size, nil
}

// checkRegular refuses a file mode that is not a regular file's, naming
// what it is instead.
func checkRegular(dir, name string, mode uint32) error {
	var kind string
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return nil
	case unix.S_IFLNK:
		return invalidf(dir, "file %q is a symlink", name)
	case unix.S_IFDIR:
		kind = "a directory"
	case unix.S_IFIFO:
		kind = "a FIFO"
	case unix.S_IFCHR, unix.S_IFBLK:
		kind = "a device node"
	case unix.S_IFSOCK:
		kind = "a socket"
	default:
		kind = fmt.Sprintf("of type %#o", mode&unix.S_IFMT)
	}
	return invalidf(dir, "file %q is not a regular file: it is %s", name, kind)
}
