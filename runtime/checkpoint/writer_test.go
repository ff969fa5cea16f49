package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Sizes of the fixture's files.
const (
	fixtureStateBytes = 2000
	fixtureDiskSize   = 8 << 20
)

// fixtureManifest is the manifest of a sandbox with one container, an
// exec, a layer disk and a scratch disk; Finish fills Format and Files.
func fixtureManifest() *Manifest {
	return &Manifest{
		Namespace: "default",
		SandboxID: "sb1",
		Machine: Machine{
			Driver: "qemu", DriverVersion: "7.2.19", MachineType: "microvm",
			VCPUs: 2, MemoryMiB: 256, Accel: "tcg", Channel: "virtio-serial",
			KernelArgs: []string{"console=hvc0", "quiet"},
			Devices:    []string{"virtio-scsi", "virtio-rng", "agent:virtio-serial"},
		},
		Guest: GuestImage{
			Version: "0.4.0",
			Kernel:  "sha256:" + strings.Repeat("a", 64),
			Initrd:  "sha256:" + strings.Repeat("b", 64),
		},
		State: StateName,
		Disks: []Disk{
			{ID: "c1-layer-0", Addr: DiskAddr{SCSIID: 0}, ReadOnly: true, Role: RoleLayer, Container: "c1", Digest: "sha256:" + strings.Repeat("c", 64)},
			{ID: "c1-scratch", Addr: DiskAddr{SCSIID: 1}, Role: RoleScratch, Container: "c1", File: "disk-c1.sparse", Size: fixtureDiskSize},
		},
		Containers: []Container{{
			ID: "c1",
			Processes: []Process{
				{GuestID: "p1", Pid: 1, Stdout: true, Stderr: true},
				{GuestID: "p2", ExecID: "e1", Pid: 7, Terminal: true, Stdin: true, Stdout: true},
			},
		}},
	}
}

// writeFixture writes the fixture checkpoint into a new directory and
// returns the directory, the manifest Finish completed, and the state
// file's content.
func writeFixture(t *testing.T) (string, *Manifest, []byte) {
	t.Helper()
	dir := t.TempDir()
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	state := fixtureState()
	f, err := w.Add(StateName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(state); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	img := sparseImage(t, fixtureDiskSize, map[int64]string{0: "superblock", 3 << 20: "data"})
	f, err = w.Add("disk-c1.sparse")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteSparse(f, img); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	m := fixtureManifest()
	if err := w.Finish(m); err != nil {
		t.Fatal(err)
	}
	return dir, m, state
}

// fixtureState is the fixture's VMM state.
func fixtureState() []byte {
	state := make([]byte, fixtureStateBytes)
	rand.New(rand.NewSource(1)).Read(state)
	return state
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestWriterRoundTrip(t *testing.T) {
	// A umask that would take the owner's write bit: the files are
	// still 0600.
	old := unix.Umask(0o277)
	dir, m, state := writeFixture(t)
	unix.Umask(old)

	if m.Format != FormatVersion || m.Created.IsZero() {
		t.Errorf("Finish set format %d, created %v", m.Format, m.Created)
	}
	if got := []string{m.Files[0].Name, m.Files[1].Name}; !slices.Equal(got, []string{StateName, "disk-c1.sparse"}) {
		t.Errorf("files %v, want them in the order added", got)
	}
	if f := m.Files[0]; f.Size != fixtureStateBytes || f.SHA256 != sha256Hex(state) {
		t.Errorf("state listed as %+v, want %d bytes, sha256 %s", f, fixtureStateBytes, sha256Hex(state))
	}
	disk, err := os.ReadFile(filepath.Join(dir, "disk-c1.sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if f := m.Files[1]; f.Size != int64(len(disk)) || f.SHA256 != sha256Hex(disk) {
		t.Errorf("disk listed as %+v, file is %d bytes, sha256 %s", f, len(disk), sha256Hex(disk))
	}
	for _, name := range []string{StateName, "disk-c1.sparse", ManifestName} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", name, st.Mode().Perm())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, tmpManifestName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary manifest is left: %v", err)
	}

	got, err := Verify(dir)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if !got.Created.Equal(m.Created) {
		t.Errorf("created read back as %v, written %v", got.Created, m.Created)
	}
	got.Created = m.Created
	if !equalJSON(t, got, m) {
		t.Errorf("manifest read back as %+v, written %+v", got, m)
	}
}

func TestWriterAbortRemovesOnlyItsFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "keep"), []byte("not the writer's"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Add("keep"); !errdefs.IsAlreadyExists(err) {
		t.Errorf("Add of an existing file: %v, want already exists", err)
	}
	for _, name := range []string{StateName, "disk-c1.sparse"} {
		f, err := w.Add(name)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("x")
		f.Close()
	}
	// A Finish that fails (the manifest names a state file not added)
	// writes no manifest.
	m := fixtureManifest()
	m.State = "other.state"
	if err := w.Finish(m); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `state file "other.state" is not listed`) {
		t.Errorf("Finish of a bad manifest: %v", err)
	}
	w.Abort()
	w.Abort()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"keep"}) {
		t.Errorf("after Abort the directory holds %v, want only keep", names)
	}
	if _, err := w.Add("late"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Add after Abort: %v, want failed precondition", err)
	}
	if err := w.Finish(fixtureManifest()); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Finish after Abort: %v, want failed precondition", err)
	}
}

func TestWriterAbortAfterFinishKeepsTheCheckpoint(t *testing.T) {
	dir := t.TempDir()
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := w.Add(StateName)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	m := fixtureManifest()
	m.Disks = m.Disks[:1]
	if err := w.Finish(m); err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if _, err := Verify(dir); err != nil {
		t.Errorf("Abort after Finish broke the checkpoint: %v", err)
	}
	if _, err := w.Add("more"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Add after Finish: %v, want failed precondition", err)
	}
}

func TestWriterRefusals(t *testing.T) {
	dir := t.TempDir()
	if _, err := NewWriter(filepath.Join(dir, "absent")); !errdefs.IsNotFound(err) {
		t.Errorf("NewWriter of a missing directory: %v, want not found", err)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := NewWriter(file); !errdefs.IsInvalidArgument(err) {
		t.Errorf("NewWriter of a file: %v, want invalid argument", err)
	}
	done, _, _ := writeFixture(t)
	if _, err := NewWriter(done); !errdefs.IsAlreadyExists(err) {
		t.Errorf("NewWriter of a finished checkpoint: %v, want already exists", err)
	}

	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", ".", "..", "../x", "a/b", "/abs", ".hidden", "a..b", ManifestName, strings.Repeat("n", 129)} {
		if _, err := w.Add(name); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Add(%q): %v, want invalid argument", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused name was created")
	}
}

func TestValidName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"vm.state", true}, {"disk-c1.sparse", true}, {"A_1", true}, {strings.Repeat("n", 128), true},
		{"", false}, {".", false}, {"..", false}, {"../x", false}, {"a/b", false}, {"-x", false},
		{"x..y", false}, {"a b", false}, {"é", false}, {strings.Repeat("n", 129), false}, {"a\x00", false},
	} {
		if err := ValidName(tc.name); (err == nil) != tc.ok {
			t.Errorf("ValidName(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
