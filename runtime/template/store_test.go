package template

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/checkpoint"
)

// testShape is a small shape: 1 MiB of guest RAM, so that its memory
// file is cheap to hash.
func testShape() Shape {
	return Shape{
		Driver: "qemu", VMM: "/usr/bin/qemu-system-x86_64", VMMID: "dev=1,ino=2,size=3,mtime=4",
		MachineType: "microvm", Devices: []string{"virtio-scsi", "agent:vsock"},
		VCPUs: 1, MemoryMiB: 1, Accel: "tcg", Channel: "vsock",
		KernelArgs: []string{"quiet"},
		Guest: checkpoint.GuestImage{
			Version: "6.1.0-test",
			Kernel:  "sha256:" + strings.Repeat("a", 64),
			Initrd:  "sha256:" + strings.Repeat("b", 64),
		},
	}
}

// fakeBuild stands for the VM: it writes into the memory file (keeping
// its size) and the state file, and counts its calls.
type fakeBuild struct {
	shape Shape
	calls atomic.Int32
	// err, if set, is what the build fails with.
	err error
	// delay is how long a build takes.
	delay time.Duration
	// machine, if set, is reported instead of the shape's machine.
	machine *checkpoint.Machine
}

func newBuild(shape Shape) *fakeBuild { return &fakeBuild{shape: shape} }

func (f *fakeBuild) build(ctx context.Context, b Build) (Built, error) {
	f.calls.Add(1)
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	if f.err != nil {
		return Built{}, f.err
	}
	mem, err := os.OpenFile(b.Memory, os.O_WRONLY, 0)
	if err != nil {
		return Built{}, err
	}
	_, err = mem.WriteAt([]byte("the guest's RAM"), 4096)
	if cerr := mem.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Built{}, err
	}
	if err := os.WriteFile(b.State, []byte("the VMM's device state"), 0o600); err != nil {
		return Built{}, err
	}
	m := checkpoint.Machine{
		Driver: f.shape.Driver, DriverVersion: "7.2.19", MachineType: f.shape.MachineType,
		VCPUs: f.shape.VCPUs, MemoryMiB: f.shape.MemoryMiB, Accel: f.shape.Accel, Channel: f.shape.Channel,
		KernelArgs: f.shape.KernelArgs, Devices: f.shape.Devices,
	}
	if f.machine != nil {
		m = *f.machine
	}
	return Built{Machine: m, Boot: 1500 * time.Millisecond, Save: 200 * time.Millisecond}, nil
}

// mustCreate makes the template of shape in s with a fake build.
func mustCreate(t *testing.T, s *Store, shape Shape) *Template {
	t.Helper()
	tpl, created, err := s.Create(context.Background(), shape, CreateOptions{}, newBuild(shape).build)
	if err != nil || !created {
		t.Fatalf("create: created %v, %v", created, err)
	}
	return tpl
}

// wantStale checks that err is ErrStale and says each of want.
func wantStale(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, ErrStale) {
		t.Fatalf("%s: %v, want ErrStale", what, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not say %q", what, err, w)
		}
	}
}

// editManifest rewrites the manifest of the template in dir with edit
// applied to it as generic JSON.
func editManifest(t *testing.T, dir string, edit func(m map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, ManifestName)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	if data, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCreateThenLookup(t *testing.T) {
	s := Open(t.TempDir())
	shape := testShape()
	b := newBuild(shape)
	made, created, err := s.Create(context.Background(), shape, CreateOptions{}, b.build)
	if err != nil || !created || b.calls.Load() != 1 {
		t.Fatalf("create: created %v, %d builds, %v", created, b.calls.Load(), err)
	}
	if made.Dir != filepath.Join(s.Dir(), shape.Key()) || made.Key() != shape.Key() {
		t.Errorf("created %s, key %s; want the directory of key %s", made.Dir, made.Key(), shape.Key())
	}
	// The first lookup goes by the stamp Create wrote; so does the next.
	for range 2 {
		got, err := s.Lookup(shape)
		if err != nil {
			t.Fatalf("lookup: %v", err)
		}
		m := got.Manifest
		if !m.Shape.Equal(shape) || m.Format != FormatVersion || m.BootMillis != 1500 || m.SaveMillis != 200 || m.Machine.DriverVersion != "7.2.19" {
			t.Errorf("manifest: %+v", m)
		}
		if mem, _ := m.file(MemoryName); mem.Size != 1<<20 {
			t.Errorf("memory file listed as %d bytes", mem.Size)
		}
	}
	got, _ := s.Lookup(shape)
	f, err := got.OpenState()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64)
	n, _ := f.Read(buf)
	if string(buf[:n]) != "the VMM's device state" {
		t.Errorf("state reads %q", buf[:n])
	}
	mem, err := os.ReadFile(got.MemoryPath())
	if err != nil || len(mem) != 1<<20 || string(mem[4096:4111]) != "the guest's RAM" {
		t.Errorf("memory file: %d bytes, %v", len(mem), err)
	}
	for _, name := range []string{MemoryName, StateName, ManifestName, stampName} {
		fi, err := os.Stat(filepath.Join(got.Dir, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v", name, err, fi.Mode())
		}
	}
}

func TestLookupOtherShape(t *testing.T) {
	s := Open(t.TempDir())
	mustCreate(t, s, testShape())
	other := testShape()
	other.VCPUs = 2
	if _, err := s.Lookup(other); !errdefs.IsNotFound(err) {
		t.Errorf("lookup of another shape: %v, want not found", err)
	}
	if _, err := Open(t.TempDir()).Lookup(testShape()); !errdefs.IsNotFound(err) {
		t.Errorf("lookup in an empty store: %v, want not found", err)
	}
}

func TestLookupShapeEdited(t *testing.T) {
	s := Open(t.TempDir())
	shape := testShape()
	tpl := mustCreate(t, s, shape)
	editManifest(t, tpl.Dir, func(m map[string]any) {
		sh := m["shape"].(map[string]any)
		sh["vcpus"], sh["accel"] = 2, "kvm"
		m["machine"].(map[string]any)["vcpus"] = 2
	})
	_, err := s.Lookup(shape)
	wantStale(t, "lookup of a template whose shape was edited", err, "vcpus", "accelerator")
	if strings.Contains(err.Error(), "memory") || strings.Contains(err.Error(), "guest image") {
		t.Errorf("lookup names fields that do not differ: %v", err)
	}
	// Load, which is asked for no shape, refuses it as well.
	_, err = s.Load(shape.Key())
	wantStale(t, "load", err, "key")
}

func TestLookupCorruptMemory(t *testing.T) {
	s := Open(t.TempDir())
	shape := testShape()
	tpl := mustCreate(t, s, shape)
	if _, err := s.Lookup(shape); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(tpl.MemoryPath(), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{'T'}, 4096)
	f.Close()
	_, err = s.Lookup(shape)
	wantStale(t, "lookup of a template whose memory changed", err, MemoryName, "sha256")
	// It stays stale: a failed verification writes no stamp.
	_, err = s.Lookup(shape)
	wantStale(t, "second lookup", err, "sha256")
}

func TestLookupTruncated(t *testing.T) {
	for _, name := range []string{MemoryName, StateName} {
		s := Open(t.TempDir())
		shape := testShape()
		tpl := mustCreate(t, s, shape)
		if err := os.Truncate(filepath.Join(tpl.Dir, name), 10); err != nil {
			t.Fatal(err)
		}
		_, err := s.Lookup(shape)
		wantStale(t, "lookup with a truncated "+name, err, name, "10 bytes")
		if name == StateName {
			if _, err := tpl.OpenState(); !errors.Is(err, ErrStale) {
				t.Errorf("open of a truncated state: %v", err)
			}
		}
	}
}

func TestLookupSymlink(t *testing.T) {
	for _, name := range []string{MemoryName, StateName, ManifestName} {
		s := Open(t.TempDir())
		shape := testShape()
		tpl := mustCreate(t, s, shape)
		p := filepath.Join(tpl.Dir, name)
		// The link's target is the file itself, moved: same content.
		moved := filepath.Join(t.TempDir(), name)
		if err := os.Rename(p, moved); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(moved, p); err != nil {
			t.Fatal(err)
		}
		_, err := s.Lookup(shape)
		wantStale(t, "lookup through a symlinked "+name, err, name)
	}
	// Nor is the template's directory followed.
	s := Open(t.TempDir())
	shape := testShape()
	tpl := mustCreate(t, s, shape)
	moved := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.Rename(tpl.Dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(moved, tpl.Dir); err != nil {
		t.Fatal(err)
	}
	_, err := s.Lookup(shape)
	wantStale(t, "lookup through a symlinked directory", err, "not a directory")
}

func TestLookupBadManifest(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(m map[string]any)
		raw  string
		want string
	}{
		{name: "unknown field", edit: func(m map[string]any) { m["extra"] = true }, want: "unknown field"},
		{name: "other format", edit: func(m map[string]any) { m["format"] = 2 }, want: "format 2"},
		{name: "other key", edit: func(m map[string]any) { m["key"] = strings.Repeat("0", 32) }, want: "names key"},
		{name: "other memory file", edit: func(m map[string]any) { m["memory"] = "ram" }, want: "names files"},
		{name: "one file", edit: func(m map[string]any) { m["files"] = m["files"].([]any)[:1] }, want: "lists 1 files"},
		{name: "bad digest", edit: func(m map[string]any) {
			m["files"].([]any)[0].(map[string]any)["sha256"] = "sha256:abc"
		}, want: "is invalid"},
		{name: "machine of another size", edit: func(m map[string]any) { m["machine"].(map[string]any)["memory_mib"] = 2 }, want: "machine does not match"},
		{name: "not JSON", raw: "{", want: ManifestName},
		{name: "empty", raw: "", want: ManifestName},
		{name: "over the bound", raw: strings.Repeat(" ", maxManifestBytes+1), want: "over the bound"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := Open(t.TempDir())
			shape := testShape()
			tpl := mustCreate(t, s, shape)
			if c.edit != nil {
				editManifest(t, tpl.Dir, c.edit)
			} else if err := os.WriteFile(filepath.Join(tpl.Dir, ManifestName), []byte(c.raw), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := s.Lookup(shape)
			wantStale(t, "lookup", err, c.want)
		})
	}
	t.Run("missing", func(t *testing.T) {
		s := Open(t.TempDir())
		tpl := mustCreate(t, s, testShape())
		os.Remove(filepath.Join(tpl.Dir, ManifestName))
		_, err := s.Lookup(testShape())
		wantStale(t, "lookup", err, ManifestName)
	})
	t.Run("not a directory", func(t *testing.T) {
		s := Open(t.TempDir())
		os.MkdirAll(s.Dir(), 0o700)
		os.WriteFile(filepath.Join(s.Dir(), testShape().Key()), nil, 0o600)
		_, err := s.Lookup(testShape())
		wantStale(t, "lookup", err, "not a directory")
	})
}

func TestLoadInvalidKey(t *testing.T) {
	s := Open(t.TempDir())
	for _, key := range []string{"", "../x", strings.Repeat("A", 32), strings.Repeat("a", 31)} {
		if _, err := s.Load(key); !errdefs.IsInvalidArgument(err) {
			t.Errorf("load %q: %v, want invalid argument", key, err)
		}
	}
}

func TestVerifyFull(t *testing.T) {
	s := Open(t.TempDir())
	shape := testShape()
	tpl := mustCreate(t, s, shape)
	if err := tpl.Verify(true); err != nil {
		t.Fatalf("full verification of a good template: %v", err)
	}
	// A change that keeps each file's status (here: a forged stamp of
	// the changed file) is found by a full verification only.
	f, _ := os.OpenFile(tpl.MemoryPath(), os.O_WRONLY, 0)
	f.WriteAt([]byte{'X'}, 0)
	f.Close()
	now, err := tpl.statuses()
	if err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(filepath.Join(tpl.Dir, stampName), stamp{Key: tpl.Key(), Files: now}); err != nil {
		t.Fatal(err)
	}
	if err := tpl.Verify(false); err != nil {
		t.Errorf("verification by the stamp: %v", err)
	}
	wantStale(t, "full verification", tpl.Verify(true), "sha256")
}

func TestShapeKey(t *testing.T) {
	base := testShape()
	if base.Key() != testShape().Key() || ValidKey(base.Key()) != nil {
		t.Fatalf("key %q is not stable or not valid", base.Key())
	}
	edits := map[string]func(*Shape){
		"driver":           func(s *Shape) { s.Driver = "other" },
		"vmm binary":       func(s *Shape) { s.VMMID = "dev=1,ino=2,size=3,mtime=5" },
		"machine type":     func(s *Shape) { s.MachineType = "q35" },
		"devices":          func(s *Shape) { s.Devices = []string{"virtio-scsi"} },
		"vcpus":            func(s *Shape) { s.VCPUs = 2 },
		"memory":           func(s *Shape) { s.MemoryMiB = 2 },
		"accelerator":      func(s *Shape) { s.Accel = "kvm" },
		"agent channel":    func(s *Shape) { s.Channel = "virtio-serial" },
		"kernel arguments": func(s *Shape) { s.KernelArgs = nil },
		"guest image":      func(s *Shape) { s.Guest.Initrd = "sha256:" + strings.Repeat("c", 64) },
	}
	keys := map[string]string{base.Key(): "base"}
	for what, edit := range edits {
		s := testShape()
		edit(&s)
		if prev, ok := keys[s.Key()]; ok {
			t.Errorf("a change of %s keeps the key of %s", what, prev)
		}
		keys[s.Key()] = what
		if s.Equal(base) {
			t.Errorf("a change of %s is equal", what)
		}
		if d := s.diff(base); len(d) != 1 || d[0] != what {
			t.Errorf("a change of %s differs in %q", what, d)
		}
	}
}

func TestValidKey(t *testing.T) {
	if err := ValidKey(testShape().Key()); err != nil {
		t.Errorf("a shape's key: %v", err)
	}
	for _, key := range []string{"", "0123", strings.Repeat("0", 33), strings.Repeat("g", 32), strings.Repeat("F", 32),
		strings.Repeat("0", 31) + "/", testShape().Key() + failedSuffix, tmpPrefix + testShape().Key()} {
		if err := ValidKey(key); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ValidKey(%q) = %v, want invalid argument", key, err)
		}
	}
}

func TestList(t *testing.T) {
	s := Open(t.TempDir())
	if list, err := s.List(); err != nil || len(list) != 0 {
		t.Fatalf("list of a store that was never made: %v, %v", list, err)
	}
	a, b := testShape(), testShape()
	b.VCPUs = 2
	mustCreate(t, s, a)
	broken := mustCreate(t, s, b)
	os.WriteFile(filepath.Join(broken.Dir, ManifestName), []byte("{"), 0o600)
	// Neither a failure record nor a leftover is a template.
	os.WriteFile(filepath.Join(s.Dir(), strings.Repeat("c", 32)+failedSuffix), []byte(`{}`), 0o600)
	os.Mkdir(filepath.Join(s.Dir(), tmpPrefix+"x"), 0o700)

	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Key > list[1].Key {
		t.Fatalf("list: %+v", list)
	}
	for _, e := range list {
		if e.Dir != filepath.Join(s.Dir(), e.Key) || e.DiskBytes <= 0 {
			t.Errorf("entry %s: dir %s, %d bytes on disk", e.Key, e.Dir, e.DiskBytes)
		}
		switch e.Key {
		case a.Key():
			if e.Err != nil || e.Template == nil || !e.Template.Manifest.Shape.Equal(a) {
				t.Errorf("entry of the good template: %+v", e)
			}
		case b.Key():
			if !errors.Is(e.Err, ErrStale) || e.Template != nil {
				t.Errorf("entry of the broken template: %+v", e)
			}
		default:
			t.Errorf("entry of key %s", e.Key)
		}
	}
}

func TestRemove(t *testing.T) {
	s := Open(t.TempDir())
	shape := testShape()
	tpl := mustCreate(t, s, shape)
	if err := s.Remove(shape.Key()); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, err := os.Lstat(tpl.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the template's directory is still there: %v", err)
	}
	if _, err := s.Lookup(shape); !errdefs.IsNotFound(err) {
		t.Errorf("lookup after remove: %v", err)
	}
	if names, _ := readDirNames(s.Dir()); len(names) != 1 || names[0] != lockName {
		t.Errorf("the store holds %q after remove", names)
	}
	if err := s.Remove(shape.Key()); !errdefs.IsNotFound(err) {
		t.Errorf("remove of what is gone: %v, want not found", err)
	}
	if err := s.Remove("../etc"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("remove of a bad key: %v, want invalid argument", err)
	}
	// A key that has only the record of a failed creation.
	failed := filepath.Join(s.Dir(), shape.Key()+failedSuffix)
	if err := writeJSON(failed, Failure{Time: time.Now(), Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(shape.Key()); err != nil {
		t.Errorf("remove of a failure record: %v", err)
	}
	if _, err := os.Lstat(failed); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failure record is still there: %v", err)
	}
}

func TestStamped(t *testing.T) {
	s := Open(t.TempDir())
	tpl := mustCreate(t, s, testShape())
	if ok, err := tpl.Stamped(); !ok || err != nil {
		t.Errorf("stamped after create: %v, %v", ok, err)
	}
	f, _ := os.OpenFile(tpl.MemoryPath(), os.O_WRONLY, 0)
	f.WriteAt([]byte{'Y'}, 0)
	f.Close()
	if ok, err := tpl.Stamped(); ok || err != nil {
		t.Errorf("stamped after a write: %v, %v", ok, err)
	}
	os.Remove(filepath.Join(tpl.Dir, stampName))
	if ok, err := tpl.Stamped(); ok || err != nil {
		t.Errorf("stamped with no stamp: %v, %v", ok, err)
	}
	os.Truncate(tpl.MemoryPath(), 1)
	if _, err := tpl.Stamped(); !errors.Is(err, ErrStale) {
		t.Errorf("stamped with a truncated file: %v", err)
	}
}

func TestFailures(t *testing.T) {
	s := Open(t.TempDir())
	if list, err := s.Failures(); err != nil || len(list) != 0 {
		t.Fatalf("failures of a store never made: %v, %v", list, err)
	}
	os.MkdirAll(s.Dir(), 0o700)
	a, b := strings.Repeat("b", 32), strings.Repeat("a", 32)
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	writeJSON(filepath.Join(s.Dir(), a+failedSuffix), Failure{Time: when, Error: "boom"})
	os.WriteFile(filepath.Join(s.Dir(), b+failedSuffix), []byte("?"), 0o600)
	os.WriteFile(filepath.Join(s.Dir(), "x"+failedSuffix), []byte("{}"), 0o600)
	list, err := s.Failures()
	if err != nil || len(list) != 2 {
		t.Fatalf("failures: %+v, %v", list, err)
	}
	if list[0].Key != b || list[0].Error != "unreadable record" || list[1].Key != a || list[1].Error != "boom" || !list[1].Time.Equal(when) {
		t.Errorf("failures: %+v", list)
	}
}
