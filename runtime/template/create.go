package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/checkpoint"
)

// ErrBusy is returned by a Create that would wait for another creation
// and was asked not to.
var ErrBusy = errors.New("another template is being created")

// Build is where a BuildFunc saves the template's VM.
type Build struct {
	// Dir is the template's directory while it is made.
	Dir string
	// Memory is the guest RAM file (0600, sized to the shape's memory,
	// sparse): the VM maps it shared, and its RAM is the file.
	Memory string
	// State is the empty file (0600) the VMM state is saved to.
	State string
}

// Built is what a BuildFunc reports.
type Built struct {
	// Machine is the VM as it ran, its VMM version included.
	Machine checkpoint.Machine
	// Boot is the time from launch to a ready agent; Save the save's.
	Boot, Save time.Duration
}

// BuildFunc boots the shape's guest with its RAM in b.Memory, waits for
// its agent and saves it to b.State, and stops it.
type BuildFunc func(ctx context.Context, b Build) (Built, error)

// CreateOptions tune Create.
type CreateOptions struct {
	// NoWait fails with ErrBusy rather than wait for another creation.
	NoWait bool
	// Replace makes a new template even if a valid one exists.
	Replace bool
	// Automatic says the creation was not asked for by hand: its
	// failure is recorded (<key>.failed) so that it is not tried again
	// before FailureBackoff has passed.
	Automatic bool
}

// FailureBackoff is how long after a failed automatic creation the next
// automatic one of the same key waits.
const FailureBackoff = time.Hour

// Create makes the template of shape with build. One template is made at
// a time on the host (the store's creation lock). If a valid template of
// the shape exists (after waiting for the lock), it is returned with
// created false. The template is made in a temporary directory, its
// files synced and hashed, its manifest and stamp written, and then
// renamed into place: a reader sees a whole template or none. On error
// nothing of it is left.
func (s *Store) Create(ctx context.Context, shape Shape, o CreateOptions, build BuildFunc) (_ *Template, created bool, retErr error) {
	key := shape.Key()
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("templates: %w", err)
	}
	unlock, err := s.lock(ctx, o.NoWait)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	if !o.Replace {
		t, err := s.Lookup(shape)
		if err == nil {
			return t, false, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, ErrStale) {
			return nil, false, err
		}
	}
	if o.Automatic {
		if f := s.Failure(key); f != nil && time.Since(f.Time) < FailureBackoff {
			return nil, false, fmt.Errorf("template %s: the last automatic creation failed %s ago (%s); not retried before %v have passed, or by `cocoon template create`: %w",
				key, time.Since(f.Time).Round(time.Second), f.Error, FailureBackoff, errdefs.ErrFailedPrecondition)
		}
	}
	defer func() {
		if retErr != nil && o.Automatic {
			_ = writeJSON(filepath.Join(s.dir, key+failedSuffix), Failure{Time: time.Now().UTC(), Error: retErr.Error()})
		}
	}()

	tmp, err := os.MkdirTemp(s.dir, tmpPrefix+key+"-")
	if err != nil {
		return nil, false, fmt.Errorf("template %s: %w", key, err)
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(tmp)
		}
	}()
	b := Build{Dir: tmp, Memory: filepath.Join(tmp, MemoryName), State: filepath.Join(tmp, StateName)}
	if err := makeFile(b.Memory, int64(shape.MemoryMiB)<<20); err != nil {
		return nil, false, fmt.Errorf("template %s: memory file: %w", key, err)
	}
	if err := makeFile(b.State, 0); err != nil {
		return nil, false, fmt.Errorf("template %s: state file: %w", key, err)
	}
	built, err := build(ctx, b)
	if err != nil {
		return nil, false, fmt.Errorf("template %s: %w", key, err)
	}
	files, err := listFiles(tmp, StateName, MemoryName)
	if err != nil {
		return nil, false, fmt.Errorf("template %s: %w", key, err)
	}
	m := &Manifest{
		Format: FormatVersion, Key: key, Created: time.Now().UTC(), Shape: shape, Machine: built.Machine,
		State: StateName, Memory: MemoryName, Files: files,
		BootMillis: built.Boot.Milliseconds(), SaveMillis: built.Save.Milliseconds(),
	}
	// What is put in place must load: a template Load refuses would be
	// passed over by every sandbox of the shape, each asking for it anew.
	data, err := json.Marshal(m)
	if err != nil {
		return nil, false, fmt.Errorf("template %s: manifest: %w", key, err)
	}
	if _, err := decodeManifest(data, key); err != nil {
		return nil, false, fmt.Errorf("template %s: what the build left would not load: %v", key, err)
	}
	if err := writeJSON(filepath.Join(tmp, ManifestName), m); err != nil {
		return nil, false, fmt.Errorf("template %s: manifest: %w", key, err)
	}
	// The files were hashed as they are on disk (synced, the VM gone):
	// their status now is the stamp of that verification.
	t := &Template{Dir: tmp, Manifest: m}
	now, err := t.statuses()
	if err != nil {
		return nil, false, err
	}
	if err := t.writeStamp(now); err != nil {
		return nil, false, fmt.Errorf("template %s: stamp: %w", key, err)
	}
	final := filepath.Join(s.dir, key)
	if _, err := os.Lstat(final); err == nil {
		if err := removeAside(s.dir, final); err != nil {
			return nil, false, err
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, false, fmt.Errorf("template %s: %w", key, err)
	}
	if err := syncDir(s.dir); err != nil {
		return nil, false, fmt.Errorf("template %s: %w", key, err)
	}
	os.Remove(filepath.Join(s.dir, key+failedSuffix))
	t.Dir = final
	// The stamp records inodes, which a rename keeps.
	return t, true, nil
}

// lock takes the store's creation lock, waiting for it unless noWait.
func (s *Store) lock(ctx context.Context, noWait bool) (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.dir, lockName), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("templates: creation lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("templates: creation lock: %w", err)
		}
		if noWait {
			f.Close()
			return nil, ErrBusy
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("templates: wait for another creation: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Creating says whether a creation holds the store's lock now (this
// process's or another's).
func (s *Store) Creating() bool {
	if _, err := os.Stat(s.dir); err != nil {
		return false
	}
	unlock, err := s.lock(context.Background(), true)
	if err != nil {
		return errors.Is(err, ErrBusy)
	}
	unlock()
	return false
}

// makeFile creates path exclusively, mode 0600, of size bytes (a hole).
func makeFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Chmod(0o600); err != nil {
		return err
	}
	return f.Truncate(size)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Current is what the host runs now, for GC: templates of another guest
// image or VMM binary can never be used again.
type Current struct {
	Guest checkpoint.GuestImage
	VMM   string
	VMMID string
}

// Removed is one thing GC removed, and why.
type Removed struct {
	Name   string
	Reason string
}

// GC removes what can never be used: templates that do not hold together
// (manifest, files, digests), templates of another guest image or VMM
// binary than cur, records of failed creations, and the leftovers of
// interrupted creations and removals. It takes the creation lock, so it
// never removes a template being made; a creation running elsewhere makes
// it skip the leftovers.
func (s *Store) GC(ctx context.Context, cur Current) ([]Removed, error) {
	names, err := readDirNames(s.dir)
	if err != nil || names == nil {
		return nil, err
	}
	unlock, lockErr := s.lock(ctx, true)
	if lockErr == nil {
		defer unlock()
	}
	var out []Removed
	var errs []error
	remove := func(name, reason string, dir bool) {
		p := filepath.Join(s.dir, name)
		var err error
		if dir {
			err = removeAside(s.dir, p)
		} else {
			err = os.Remove(p)
		}
		if err != nil {
			errs = append(errs, err)
			return
		}
		out = append(out, Removed{Name: name, Reason: reason})
	}
	for _, name := range names {
		switch {
		case strings.HasPrefix(name, tmpPrefix):
			if lockErr == nil {
				if err := os.RemoveAll(filepath.Join(s.dir, name)); err != nil {
					errs = append(errs, err)
				} else {
					out = append(out, Removed{Name: name, Reason: "left over by an interrupted creation or removal"})
				}
			}
		case strings.HasSuffix(name, failedSuffix):
			// A recent record holds the automatic retry back; gc
			// leaves it until its backoff has passed.
			if f := s.Failure(strings.TrimSuffix(name, failedSuffix)); f == nil || time.Since(f.Time) >= FailureBackoff {
				remove(name, "record of a failed creation", false)
			}
		case ValidKey(name) == nil:
			t, err := s.Load(name)
			if err == nil {
				err = t.Verify(false)
			}
			switch {
			case err != nil && !errors.Is(err, ErrStale):
				// Not the template's fault (the stamp could not be
				// written, say): it stays.
				errs = append(errs, err)
			case err != nil:
				remove(name, err.Error(), true)
			case t.Manifest.Shape.Guest != cur.Guest:
				remove(name, fmt.Sprintf("made for guest image %s, the installed one is %s", guestNames(t.Manifest.Shape.Guest), guestNames(cur.Guest)), true)
			case cur.VMM != "" && (t.Manifest.Shape.VMM != cur.VMM || t.Manifest.Shape.VMMID != cur.VMMID):
				remove(name, fmt.Sprintf("made with VMM %s (%s), the installed one is %s (%s)", t.Manifest.Shape.VMM, t.Manifest.Shape.VMMID, cur.VMM, cur.VMMID), true)
			}
		}
	}
	return out, errors.Join(errs...)
}

// LogName is the log of background creations, in the store.
const LogName = "create.log"

// maxLogBytes bounds LogName: a larger log is cut before a creation
// appends to it.
const maxLogBytes = 1 << 20

// Spawn starts exe (the cocoon command) with args, in the background and
// detached (its own session, stdin from /dev/null, output appended to the
// store's LogName), and does not wait for it: a background creation must
// outlive the process that asked for it and never delay it. It returns
// the child's pid.
func (s *Store) Spawn(exe string, args []string) (int, error) {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return 0, fmt.Errorf("templates: %w", err)
	}
	logPath := filepath.Join(s.dir, LogName)
	if fi, err := os.Stat(logPath); err == nil && fi.Size() > maxLogBytes {
		os.Truncate(logPath, 0)
	}
	out, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("templates: log: %w", err)
	}
	defer out.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer null.Close()
	p, err := os.StartProcess(exe, append([]string{exe}, args...), &os.ProcAttr{
		Dir:   "/",
		Env:   os.Environ(),
		Files: []*os.File{null, out, out},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		return 0, fmt.Errorf("templates: start %s: %w", exe, err)
	}
	pid := p.Pid
	// Reaped by whoever outlives it: the caller does not wait, and a
	// child whose parent exits is reparented.
	go p.Wait()
	return pid, nil
}

// guestNames names a guest image by its kernel release and the digests
// of its kernel and initrd (a new agent is a new initrd).
func guestNames(g checkpoint.GuestImage) string {
	return g.Version + " kernel " + g.Kernel + " initrd " + g.Initrd
}
