package containerdconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Read reads containerd's main config file at path and Cocoon's drop-in
// beside it, as they are under root: the host's filesystem as this
// process sees it ("/" on the host itself).
func Read(root, path string) (Files, error) {
	if !filepath.IsAbs(path) {
		return Files{}, fmt.Errorf("containerd config %q: want an absolute path", path)
	}
	f := Files{Path: filepath.Clean(path)}
	var err error
	if f.Main, err = readFile(filepath.Join(root, f.Path)); err != nil {
		return Files{}, err
	}
	if f.DropIn, err = readFile(filepath.Join(root, DropInPath(f.Path))); err != nil {
		return Files{}, err
	}
	return f, nil
}

func readFile(name string) (File, error) {
	data, err := os.ReadFile(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return File{}, nil
	case err != nil:
		return File{}, err
	}
	return File{Exists: true, Data: data}, nil
}

// Write makes the files under root what to holds, where it differs from
// from (what Read found): each written whole to a temporary file and
// renamed into place, with the mode and owner of the file it replaces
// (0644, root's, for a new one), or removed. The drop-in is written
// before the main file that imports it, and removed after it.
func Write(root string, from, to Files) error {
	mainName := filepath.Join(root, to.Path)
	dropInName := filepath.Join(root, DropInPath(to.Path))
	if to.DropIn.Exists && !to.DropIn.equal(from.DropIn) {
		if err := writeFile(dropInName, to.DropIn.Data); err != nil {
			return err
		}
	}
	if !to.Main.equal(from.Main) {
		if err := putFile(mainName, to.Main); err != nil {
			return err
		}
	}
	if !to.DropIn.Exists && from.DropIn.Exists {
		if err := os.Remove(dropInName); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func putFile(name string, f File) error {
	if !f.Exists {
		if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	return writeFile(name, f.Data)
}

func writeFile(name string, data []byte) error {
	mode, uid, gid := fs.FileMode(0o644), -1, -1
	if fi, err := os.Stat(name); err == nil {
		mode = fi.Mode().Perm()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(st.Uid), int(st.Gid)
		}
	}
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	return ReplaceFile(name, bytes.NewReader(data), mode, uid, gid)
}

// ReplaceFile writes what src holds to dst through a temporary file
// renamed into place (a running program keeps the file it opened), with
// mode, and owner uid and gid unless they are -1.
func ReplaceFile(dst string, src io.Reader, mode fs.FileMode, uid, gid int) (retErr error) {
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".cocoon-*")
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, src); err != nil {
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		return err
	}
	if uid >= 0 {
		if err := tmp.Chown(uid, gid); err != nil {
			return err
		}
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
