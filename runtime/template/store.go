package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/checkpoint"
)

// Store is the directory of templates.
type Store struct {
	dir string
}

// Open returns the store of templates under dataDir. Nothing is made
// until a template is created.
func Open(dataDir string) *Store {
	return &Store{dir: filepath.Join(dataDir, DirName)}
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Template is a template that was found and verified.
type Template struct {
	// Dir is its directory.
	Dir string
	// Manifest is its manifest.
	Manifest *Manifest
}

// Key is the template's key.
func (t *Template) Key() string { return t.Manifest.Key }

// MemoryPath is the guest RAM file a clone maps privately.
func (t *Template) MemoryPath() string { return filepath.Join(t.Dir, t.Manifest.Memory) }

// OpenState opens the VMM state, read-only, refusing anything but the
// regular file of the size the manifest lists.
func (t *Template) OpenState() (*os.File, error) {
	want, _ := t.Manifest.file(t.Manifest.State)
	f, st, err := openRegular(filepath.Join(t.Dir, want.Name))
	if err != nil {
		return nil, t.stale("%v", err)
	}
	if st.Size != want.Size {
		f.Close()
		return nil, t.stale("%s is %d bytes, the manifest says %d", want.Name, st.Size, want.Size)
	}
	return f, nil
}

// stale is the error of a template that does not hold together.
func (t *Template) stale(format string, args ...any) error {
	return fmt.Errorf("template %s: %s: %w", t.Dir, fmt.Sprintf(format, args...), ErrStale)
}

// Lookup returns the template of shape, verified: its manifest read and
// checked, its shape the one asked for, its files of the listed sizes and
// digests. The digests are computed once; the stamp of that check
// (verified.json: each file's inode, size, modification and change
// times) lets later lookups check only the files' status, which any
// write to a file changes.
//
// There being no template is errdefs.ErrNotFound. A template that is
// there but does not fit or does not hold together is ErrStale, with a
// reason: it is never loaded.
func (s *Store) Lookup(shape Shape) (*Template, error) {
	key := shape.Key()
	t, err := s.Load(key)
	var ske *shapeKeyError
	if errors.As(err, &ske) {
		if d := ske.shape.diff(shape); len(d) > 0 {
			return nil, (&Template{Dir: filepath.Join(s.dir, key)}).stale("made for another shape (%s differ; its key is %s)", strings.Join(d, ", "), ske.got)
		}
	}
	if err != nil {
		return nil, err
	}
	if !t.Manifest.Shape.Equal(shape) {
		return nil, t.stale("made for another shape (%s differ)", strings.Join(t.Manifest.Shape.diff(shape), ", "))
	}
	if err := t.Verify(false); err != nil {
		return nil, err
	}
	return t, nil
}

// Load reads the manifest of the template key without verifying its
// files. There being none is errdefs.ErrNotFound.
func (s *Store) Load(key string) (*Template, error) {
	if err := ValidKey(key); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.dir, key)
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("template %s: %w", key, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", key, err)
	}
	t := &Template{Dir: dir}
	if !fi.IsDir() {
		return nil, t.stale("not a directory")
	}
	f, _, err := openRegular(filepath.Join(dir, ManifestName))
	if err != nil {
		return nil, t.stale("%v", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	if err != nil {
		return nil, t.stale("%v", err)
	}
	m, err := decodeManifest(data, key)
	if err != nil {
		// Wrapped, not formatted: Lookup looks into a shapeKeyError.
		return nil, fmt.Errorf("template %s: %w: %w", t.Dir, err, ErrStale)
	}
	t.Manifest = m
	return t, nil
}

// stamp is verified.json: the status of each file when its digest was
// last found to be the listed one.
type stamp struct {
	Key   string       `json:"key"`
	Files []fileStatus `json:"files"`
}

type fileStatus struct {
	Name  string `json:"name"`
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	MTime int64  `json:"mtime_ns"`
	CTime int64  `json:"ctime_ns"`
}

// Verify checks the template's files against its manifest: by status
// against the stamp of an earlier full check, or (full, or no stamp that
// matches) by digest, writing the stamp when they pass.
func (t *Template) Verify(full bool) error {
	now, err := t.statuses()
	if err != nil {
		return err
	}
	if !full {
		if old, err := t.readStamp(); err == nil && old.Key == t.Manifest.Key && equalStatuses(old.Files, now) {
			return nil
		}
	}
	for _, want := range t.Manifest.Files {
		got, err := hashFile(filepath.Join(t.Dir, want.Name))
		if err != nil {
			return t.stale("%v", err)
		}
		if got != want.SHA256 {
			return t.stale("%s: sha256 is %s, the manifest says %s", want.Name, got, want.SHA256)
		}
	}
	// The files must not have changed while they were hashed.
	after, err := t.statuses()
	if err != nil {
		return err
	}
	if !equalStatuses(now, after) {
		return t.stale("its files changed while they were verified")
	}
	return t.writeStamp(now)
}

// writeStamp records files' status as that of their verified digests.
func (t *Template) writeStamp(files []fileStatus) error {
	return writeJSON(filepath.Join(t.Dir, stampName), stamp{Key: t.Manifest.Key, Files: files})
}

// Stamped says, without hashing, whether the template's files are as the
// last full verification found them (by their status): if they are not,
// the next lookup hashes them again. A file that is missing, not a
// regular file or not of its listed size is ErrStale.
func (t *Template) Stamped() (bool, error) {
	now, err := t.statuses()
	if err != nil {
		return false, err
	}
	old, err := t.readStamp()
	return err == nil && old.Key == t.Manifest.Key && equalStatuses(old.Files, now), nil
}

// statuses are the current status of each listed file, of the listed size.
func (t *Template) statuses() ([]fileStatus, error) {
	var out []fileStatus
	for _, want := range t.Manifest.Files {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(t.Dir, want.Name), &st); err != nil {
			return nil, t.stale("%s: %v", want.Name, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return nil, t.stale("%s is not a regular file", want.Name)
		}
		if st.Size != want.Size {
			return nil, t.stale("%s is %d bytes, the manifest says %d", want.Name, st.Size, want.Size)
		}
		out = append(out, fileStatus{
			Name: want.Name, Dev: st.Dev, Ino: st.Ino, Size: st.Size,
			MTime: st.Mtim.Nano(), CTime: st.Ctim.Nano(),
		})
	}
	return out, nil
}

func equalStatuses(a, b []fileStatus) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (t *Template) readStamp() (stamp, error) {
	var st stamp
	f, _, err := openRegular(filepath.Join(t.Dir, stampName))
	if err != nil {
		return st, err
	}
	defer f.Close()
	err = json.NewDecoder(io.LimitReader(f, 64<<10)).Decode(&st)
	return st, err
}

// Entry is one template of the store, as List finds it.
type Entry struct {
	// Key is the template's key; Dir its directory.
	Key string
	Dir string
	// Template is the template, its manifest read; nil if it could not
	// be (Err says why).
	Template *Template
	Err      error
	// DiskBytes is what its files take on disk.
	DiskBytes int64
}

// List returns the store's templates, sorted by key, each with its
// manifest or the reason it cannot be read. Files are not verified.
func (s *Store) List() ([]Entry, error) {
	names, err := readDirNames(s.dir)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, name := range names {
		if ValidKey(name) != nil {
			continue
		}
		e := Entry{Key: name, Dir: filepath.Join(s.dir, name), DiskBytes: diskBytes(filepath.Join(s.dir, name))}
		e.Template, e.Err = s.Load(name)
		out = append(out, e)
	}
	return out, nil
}

// Remove deletes the template key and the record of its failed creation.
// Clones running from it keep their mapping of its memory; new sandboxes
// cold-boot. Removing what is not there is errdefs.ErrNotFound.
func (s *Store) Remove(key string) error {
	if err := ValidKey(key); err != nil {
		return err
	}
	dir := filepath.Join(s.dir, key)
	_, statErr := os.Lstat(dir)
	failed := os.Remove(filepath.Join(s.dir, key+failedSuffix))
	if errors.Is(statErr, os.ErrNotExist) {
		if failed == nil {
			return nil
		}
		return fmt.Errorf("template %s: %w", key, errdefs.ErrNotFound)
	}
	return removeAside(s.dir, dir)
}

// removeAside removes dir by renaming it to a temporary name first, so
// that no reader ever sees half of it.
func removeAside(store, dir string) error {
	aside, err := os.MkdirTemp(store, tmpPrefix+"rm-")
	if err != nil {
		return fmt.Errorf("remove template: %w", err)
	}
	target := filepath.Join(aside, "t")
	if err := os.Rename(dir, target); err != nil {
		os.Remove(aside)
		return fmt.Errorf("remove template %s: %w", dir, err)
	}
	return os.RemoveAll(aside)
}

// Failure is the record of a failed automatic creation.
type Failure struct {
	Time  time.Time `json:"time"`
	Error string    `json:"error"`
}

// Failure returns the record of the last failed creation of key, or nil.
func (s *Store) Failure(key string) *Failure {
	f, _, err := openRegular(filepath.Join(s.dir, key+failedSuffix))
	if err != nil {
		return nil
	}
	defer f.Close()
	var rec Failure
	if json.NewDecoder(io.LimitReader(f, 64<<10)).Decode(&rec) != nil {
		return &Failure{Error: "unreadable record"}
	}
	return &rec
}

// KeyFailure is the record of a failed creation of a key.
type KeyFailure struct {
	Key string
	Failure
}

// Failures returns the records of failed automatic creations, sorted by
// key, whether or not a template of the key exists.
func (s *Store) Failures() ([]KeyFailure, error) {
	names, err := readDirNames(s.dir)
	if err != nil {
		return nil, err
	}
	var out []KeyFailure
	for _, name := range names {
		key, ok := strings.CutSuffix(name, failedSuffix)
		if !ok || ValidKey(key) != nil {
			continue
		}
		if f := s.Failure(key); f != nil {
			out = append(out, KeyFailure{Key: key, Failure: *f})
		}
	}
	return out, nil
}

// openRegular opens path read-only if it is a regular file (never through
// a symlink, never blocking on a FIFO) and returns its status.
func openRegular(path string) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, st, fmt.Errorf("open %s: %w", filepath.Base(path), err)
	}
	f := os.NewFile(uintptr(fd), path)
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, st, fmt.Errorf("stat %s: %w", filepath.Base(path), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, st, fmt.Errorf("%s is not a regular file", filepath.Base(path))
	}
	return f, st, nil
}

// hashFile is the sha256 of a regular file, in hex.
func hashFile(path string) (string, error) {
	f, _, err := openRegular(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", filepath.Base(path), err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeJSON writes v to path atomically, mode 0600.
func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), tmpPrefix+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func readDirNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, nil
}

// diskBytes is what the regular files of dir take on disk.
func diskBytes(dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
	}
	return n
}

// listFiles is the manifest's listing of the files of dir.
func listFiles(dir string, names ...string) ([]checkpoint.File, error) {
	var out []checkpoint.File
	for _, name := range names {
		p := filepath.Join(dir, name)
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return nil, err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("sync %s: %w", name, err)
		}
		sum, err := hashFile(p)
		if err != nil {
			return nil, err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		out = append(out, checkpoint.File{Name: name, Size: fi.Size(), SHA256: sum})
	}
	return out, nil
}
