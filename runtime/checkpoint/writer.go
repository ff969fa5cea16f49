package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/errdefs"
)

// tmpManifestName is where Finish writes the manifest before it renames
// it into place. It starts with a dot, so no name Add takes can be it.
const tmpManifestName = "." + ManifestName + ".tmp"

// writerState is where a Writer is in its life.
type writerState uint8

const (
	// writerOpen takes files.
	writerOpen writerState = iota
	// writerFinished wrote the manifest; the checkpoint is complete.
	writerFinished
	// writerAborted removed what it had made.
	writerAborted
)

// Writer fills a checkpoint directory: Add a file for the VMM state and
// for each scratch disk, write them, then Finish writes the manifest
// that lists them. On a failure, Abort leaves the directory as the
// writer found it.
type Writer struct {
	// dir is the checkpoint directory.
	dir string
	// mu guards the fields below. It serializes Add, Finish and Abort;
	// Finish holds it while it syncs and hashes the files, which is
	// local disk I/O only.
	mu sync.Mutex
	// added are the names Add created, in order.
	added []string
	// wroteManifest is set once Finish renamed the manifest into place,
	// so that an Abort after a failed Finish removes it too.
	wroteManifest bool
	// state is writerOpen until Finish succeeds or Abort runs.
	state writerState
}

// NewWriter returns a writer of the checkpoint directory dir, which must
// exist (containerd makes it) and must not hold a manifest yet.
func NewWriter(dir string) (*Writer, error) {
	st, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("checkpoint %s: no such directory: %w", dir, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("checkpoint %s: not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Lstat(filepath.Join(dir, ManifestName)); err == nil {
		return nil, fmt.Errorf("checkpoint %s: already holds a %s: %w", dir, ManifestName, errdefs.ErrAlreadyExists)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	return &Writer{dir: dir}, nil
}

// Dir is the checkpoint directory.
func (w *Writer) Dir() string { return w.dir }

// Add creates the file name (ValidName, not the manifest's) in the
// checkpoint directory, exclusively and with mode 0600 whatever the
// umask, and returns it open for writing. The caller writes and closes
// it before Finish; Finish lists it.
func (w *Writer) Add(name string) (*os.File, error) {
	if err := ValidName(name); err != nil {
		return nil, fmt.Errorf("checkpoint %s: add file %w", w.dir, err)
	}
	if name == ManifestName {
		return nil, fmt.Errorf("checkpoint %s: add file %q: the name is the manifest's: %w", w.dir, name, errdefs.ErrInvalidArgument)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != writerOpen {
		return nil, fmt.Errorf("checkpoint %s: add file %q: the writer is %s: %w", w.dir, name, w.state, errdefs.ErrFailedPrecondition)
	}
	p := filepath.Join(w.dir, name)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("checkpoint %s: add file %q: it already exists: %w", w.dir, name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: add file %q: %w", w.dir, name, err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		os.Remove(p)
		return nil, fmt.Errorf("checkpoint %s: add file %q: %w", w.dir, name, err)
	}
	w.added = append(w.added, name)
	return f, nil
}

// Finish completes the checkpoint: it syncs and hashes every added file,
// sets m.Format, m.Files (the added files, in order) and, if zero,
// m.Created, checks m as ReadManifest would, and writes it as
// manifest.json (mode 0600, through a temporary name, synced, renamed,
// and the directory synced). A failed Finish may be retried or followed
// by Abort.
func (w *Writer) Finish(m *Manifest) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != writerOpen {
		return fmt.Errorf("checkpoint %s: finish: the writer is %s: %w", w.dir, w.state, errdefs.ErrFailedPrecondition)
	}
	files := make([]File, 0, len(w.added))
	for _, name := range w.added {
		f, err := w.sealFile(name)
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	m.Format = FormatVersion
	if m.Created.IsZero() {
		m.Created = time.Now().UTC()
	}
	m.Files = files
	if err := m.validate(); err != nil {
		return invalidf(w.dir, "%v", err)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("checkpoint %s: encode %s: %w", w.dir, ManifestName, err)
	}
	data = append(data, '\n')
	if len(data) > maxManifestBytes {
		return invalidf(w.dir, "%s would be %d bytes, over the bound of %d", ManifestName, len(data), maxManifestBytes)
	}
	if err := w.writeManifest(data); err != nil {
		return err
	}
	w.state = writerFinished
	return nil
}

// sealFile syncs the added file name to disk and returns its listing.
func (w *Writer) sealFile(name string) (File, error) {
	f, size, err := openRegular(w.dir, name)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return File{}, fmt.Errorf("checkpoint %s: sync file %q: %w", w.dir, name, err)
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return File{}, fmt.Errorf("checkpoint %s: hash file %q: %w", w.dir, name, err)
	}
	if n != size {
		return File{}, fmt.Errorf("checkpoint %s: file %q changed size while it was hashed (%d bytes, then %d): is it still being written? %w",
			w.dir, name, size, n, errdefs.ErrFailedPrecondition)
	}
	return File{Name: name, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// writeManifest puts data in place as the manifest, durably.
func (w *Writer) writeManifest(data []byte) (retErr error) {
	tmp := filepath.Join(w.dir, tmpManifestName)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("checkpoint %s: write %s: %w", w.dir, ManifestName, err)
	}
	renamed := false
	defer func() {
		if retErr != nil && !renamed {
			os.Remove(tmp)
		}
	}()
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Chmod(0o600)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("checkpoint %s: write %s: %w", w.dir, ManifestName, werr)
	}
	if err := os.Rename(tmp, filepath.Join(w.dir, ManifestName)); err != nil {
		return fmt.Errorf("checkpoint %s: write %s: %w", w.dir, ManifestName, err)
	}
	renamed, w.wroteManifest = true, true
	return syncDir(w.dir)
}

// syncDir makes the names in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("checkpoint %s: sync directory: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("checkpoint %s: sync directory: %w", dir, err)
	}
	return nil
}

// Abort removes every file the writer added, and the manifest if a
// failed Finish got as far as writing it, so that a failed checkpoint
// leaves the directory as the writer found it. Files the writer did not
// create are never touched. After a successful Finish, Abort does
// nothing: `defer w.Abort()` is safe on the path that finishes. It may be
// called more than once.
func (w *Writer) Abort() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != writerOpen {
		return
	}
	w.state = writerAborted
	for _, name := range w.added {
		os.Remove(filepath.Join(w.dir, name))
	}
	if w.wroteManifest {
		os.Remove(filepath.Join(w.dir, ManifestName))
	}
	w.added = nil
}

func (s writerState) String() string {
	switch s {
	case writerOpen:
		return "open"
	case writerFinished:
		return "finished"
	case writerAborted:
		return "aborted"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}
