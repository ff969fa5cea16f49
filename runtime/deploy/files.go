package deploy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/cocoonrt/cocoon/runtime/containerdconfig"
)

// recordName is the record's file in the state directory.
const recordName = "installed.json"

// record is what install placed on the host, so that uninstall removes
// that and nothing else. It is saved before each change it records.
type record struct {
	// Files are the files install placed, in the order it placed them.
	Files []placed `json:"files"`
	// Dirs are the directories install made, each after its parent.
	Dirs []string `json:"dirs"`
	// RestartPending is set while containerd's configuration has
	// changed and containerd has not been restarted on it: a later
	// install or uninstall restarts it even if it changes nothing.
	RestartPending bool `json:"restart_pending,omitempty"`
}

// placed is a file install placed, by its host path.
type placed struct {
	Path string `json:"path"`
	// SHA256 is the digest of what install wrote.
	SHA256 string `json:"sha256"`
	// Backup holds the file install replaced, which was not its own;
	// BackupSHA256 is that file's digest.
	Backup       string `json:"backup,omitempty"`
	BackupSHA256 string `json:"backup_sha256,omitempty"`
}

func (r *record) file(path string) *placed {
	for i := range r.Files {
		if r.Files[i].Path == path {
			return &r.Files[i]
		}
	}
	return nil
}

func (in *installer) recordPath() string {
	return filepath.Join(in.o.StateDir, recordName)
}

func (in *installer) loadRecord() error {
	data, err := os.ReadFile(in.hostPath(in.recordPath()))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &in.rec); err != nil {
		return fmt.Errorf("%s: %w", in.recordPath(), err)
	}
	return nil
}

func (in *installer) saveRecord() error {
	data, err := json.MarshalIndent(in.rec, "", "  ")
	if err != nil {
		return err
	}
	name := in.hostPath(in.recordPath())
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// ensureStateDir makes the state directory, recording the directories
// it made (the record lives in it, so it is saved once they exist).
func (in *installer) ensureStateDir() error {
	missing, err := in.missingDirs(in.o.StateDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(in.hostPath(in.o.StateDir), 0o755); err != nil {
		return err
	}
	for _, d := range missing {
		if !slices.Contains(in.rec.Dirs, d) {
			in.rec.Dirs = append(in.rec.Dirs, d)
		}
	}
	return in.saveRecord()
}

// missingDirs are dir and those of its parents that do not exist, each
// after its parent.
func (in *installer) missingDirs(dir string) ([]string, error) {
	var missing []string
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		_, err := os.Stat(in.hostPath(d))
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		missing = append([]string{d}, missing...)
	}
	return missing, nil
}

// mkdirs makes dir and its missing parents, each recorded before it is
// made.
func (in *installer) mkdirs(dir string) error {
	missing, err := in.missingDirs(dir)
	if err != nil {
		return err
	}
	for _, d := range missing {
		in.rec.Dirs = append(in.rec.Dirs, d)
		if err := in.saveRecord(); err != nil {
			return err
		}
		if err := os.Mkdir(in.hostPath(d), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// place puts the file src at the host path dst with mode. A file that is
// already there with the same content, and not install's, is left as it
// is and not recorded: uninstall keeps it. One that differs is kept in
// the state directory and put back by uninstall.
func (in *installer) place(src, dst string, mode fs.FileMode) error {
	if err := in.checkWritable(dst); err != nil {
		return err
	}
	want, err := digest(src)
	if err != nil {
		return err
	}
	name := in.hostPath(dst)
	have, err := digest(name)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	p := in.rec.file(dst)
	if have == want {
		if p == nil {
			in.printf("%s is there already, not placed by cocoon deploy: left as it is", dst)
		}
		return nil
	}
	if err := in.mkdirs(filepath.Dir(dst)); err != nil {
		return err
	}
	verb, note := "updated", ""
	if p == nil {
		verb = "placed"
		in.rec.Files = append(in.rec.Files, placed{Path: dst})
		p = &in.rec.Files[len(in.rec.Files)-1]
		if have != "" {
			p.Backup, p.BackupSHA256 = filepath.Join(in.o.StateDir, "backup", dst), have
			if err := in.mkdirs(filepath.Dir(p.Backup)); err != nil {
				return err
			}
			if err := keepFile(name, in.hostPath(p.Backup)); err != nil {
				return err
			}
			note = " (the file it replaces is kept at " + p.Backup + ")"
		}
	}
	p.SHA256 = want
	if err := in.saveRecord(); err != nil {
		return err
	}
	if err := copyFile(src, name, mode, -1, -1); err != nil {
		return err
	}
	in.printf("%s %s%s", verb, dst, note)
	return nil
}

// unplace removes what install placed, last first, and puts back what it
// replaced; a file changed since is left as it is. Then the directories
// install made, if they are empty, and the record.
func (in *installer) unplace() error {
	var errs []error
	for i := len(in.rec.Files) - 1; i >= 0; i-- {
		p := in.rec.Files[i]
		if err := in.unplaceFile(p); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	in.rec.Files = nil
	if err := os.Remove(in.hostPath(in.recordPath())); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for i := len(in.rec.Dirs) - 1; i >= 0; i-- {
		d := in.rec.Dirs[i]
		err := os.Remove(in.hostPath(d))
		switch {
		case err == nil:
			in.printf("removed %s", d)
		case errors.Is(err, fs.ErrNotExist):
		default:
			in.printf("left %s: %v", d, errors.Unwrap(err))
		}
	}
	in.rec.Dirs = nil
	return nil
}

func (in *installer) unplaceFile(p placed) error {
	name := in.hostPath(p.Path)
	have, err := digest(name)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	switch {
	case have == p.SHA256 || have == "" && p.Backup != "":
		if p.Backup != "" {
			if err := os.Rename(in.hostPath(p.Backup), name); err != nil {
				return err
			}
			in.printf("put back the file %s replaced", p.Path)
			return nil
		}
		if err := os.Remove(name); err != nil {
			return err
		}
		in.printf("removed %s", p.Path)
	case have == "":
	case have == p.BackupSHA256:
		// Install stopped between keeping the file and replacing it.
		return os.Remove(in.hostPath(p.Backup))
	default:
		msg := "left " + p.Path + ": it changed since cocoon deploy placed it"
		if p.Backup != "" {
			msg += "; the file it replaced is at " + p.Backup
		}
		in.printf("%s", msg)
	}
	return nil
}

// digest is the hex SHA-256 of a regular file's content.
func digest(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s: not a regular file", name)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// keepFile copies the file name to backup with its mode and owner.
func keepFile(name, backup string) error {
	fi, err := os.Stat(name)
	if err != nil {
		return err
	}
	uid, gid := -1, -1
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		uid, gid = int(st.Uid), int(st.Gid)
	}
	return copyFile(name, backup, fi.Mode().Perm(), uid, gid)
}

// copyFile copies src to dst through a temporary file renamed into
// place (a running program, a shim, keeps the file it was started
// from), with mode, and owner uid and gid unless they are -1.
func copyFile(src, dst string, mode fs.FileMode, uid, gid int) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return containerdconfig.ReplaceFile(dst, in, mode, uid, gid)
}
