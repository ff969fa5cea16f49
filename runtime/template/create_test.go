package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/checkpoint"
)

// storeNames are the names in the store's directory.
func storeNames(t *testing.T, s *Store) []string {
	t.Helper()
	names, err := readDirNames(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// holdLock takes the store's creation lock as another process would,
// until the test ends.
func holdLock(t *testing.T, s *Store) {
	t.Helper()
	if err := os.MkdirAll(s.Dir(), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(s.Dir(), lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
}

func TestCreateExisting(t *testing.T) {
	s := Open(t.TempDir())
	shape := testShape()
	first := mustCreate(t, s, shape)
	b := newBuild(shape)
	got, created, err := s.Create(context.Background(), shape, CreateOptions{}, b.build)
	if err != nil || created || b.calls.Load() != 0 {
		t.Fatalf("create of an existing template: created %v, %d builds, %v", created, b.calls.Load(), err)
	}
	if got.Dir != first.Dir || got.Manifest.Created != first.Manifest.Created {
		t.Errorf("create returned %s made %v, not the existing one", got.Dir, got.Manifest.Created)
	}
}

func TestCreateReplace(t *testing.T) {
	s := Open(t.TempDir())
	shape := testShape()
	first := mustCreate(t, s, shape)
	b := newBuild(shape)
	got, created, err := s.Create(context.Background(), shape, CreateOptions{Replace: true}, b.build)
	if err != nil || !created || b.calls.Load() != 1 {
		t.Fatalf("replace: created %v, %d builds, %v", created, b.calls.Load(), err)
	}
	if !got.Manifest.Created.After(first.Manifest.Created) {
		t.Errorf("the replacement was made %v, the first %v", got.Manifest.Created, first.Manifest.Created)
	}
	if _, err := s.Lookup(shape); err != nil {
		t.Errorf("lookup after replace: %v", err)
	}
	if names := storeNames(t, s); len(names) != 2 || names[0] != lockName || names[1] != shape.Key() {
		t.Errorf("the store holds %q after replace", names)
	}
}

// A stale template of the shape is replaced without being asked.
func TestCreateOverStale(t *testing.T) {
	s := Open(t.TempDir())
	shape := testShape()
	tpl := mustCreate(t, s, shape)
	os.Truncate(tpl.MemoryPath(), 0)
	b := newBuild(shape)
	if _, created, err := s.Create(context.Background(), shape, CreateOptions{}, b.build); err != nil || !created || b.calls.Load() != 1 {
		t.Fatalf("create over a stale template: created %v, %d builds, %v", created, b.calls.Load(), err)
	}
	if _, err := s.Lookup(shape); err != nil {
		t.Errorf("lookup: %v", err)
	}
}

func TestCreateFailure(t *testing.T) {
	ctx := context.Background()
	s := Open(t.TempDir())
	shape := testShape()
	b := newBuild(shape)
	b.err = errors.New("the guest did not boot")

	// A creation asked for by hand leaves nothing, not even a record.
	if _, _, err := s.Create(ctx, shape, CreateOptions{}, b.build); err == nil || !strings.Contains(err.Error(), "the guest did not boot") {
		t.Fatalf("create with a failing build: %v", err)
	}
	if names := storeNames(t, s); len(names) != 1 || names[0] != lockName {
		t.Errorf("a failed creation left %q", names)
	}
	if f := s.Failure(shape.Key()); f != nil {
		t.Errorf("a creation by hand recorded its failure: %+v", f)
	}

	// An automatic one records it, and the next automatic one waits.
	if _, _, err := s.Create(ctx, shape, CreateOptions{Automatic: true}, b.build); err == nil {
		t.Fatal("automatic create with a failing build succeeded")
	}
	if names := storeNames(t, s); len(names) != 2 || names[1] != shape.Key()+failedSuffix {
		t.Errorf("a failed automatic creation left %q", names)
	}
	f := s.Failure(shape.Key())
	if f == nil || !strings.Contains(f.Error, "the guest did not boot") || time.Since(f.Time) > time.Minute {
		t.Fatalf("failure record: %+v", f)
	}
	calls := b.calls.Load()
	_, _, err := s.Create(ctx, shape, CreateOptions{Automatic: true}, b.build)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "the guest did not boot") {
		t.Errorf("automatic create within the backoff: %v, want failed precondition", err)
	}
	if b.calls.Load() != calls {
		t.Errorf("automatic create within the backoff built")
	}
	// The record is not rewritten by the refusal: its time stays.
	if again := s.Failure(shape.Key()); again == nil || !again.Time.Equal(f.Time) {
		t.Errorf("the failure record became %+v", again)
	}

	// Past the backoff an automatic creation tries again.
	old := Failure{Time: time.Now().Add(-FailureBackoff - time.Minute), Error: "long ago"}
	if err := writeJSON(filepath.Join(s.Dir(), shape.Key()+failedSuffix), old); err != nil {
		t.Fatal(err)
	}
	good := newBuild(shape)
	if _, created, err := s.Create(ctx, shape, CreateOptions{Automatic: true}, good.build); err != nil || !created {
		t.Fatalf("automatic create past the backoff: created %v, %v", created, err)
	}
	if f := s.Failure(shape.Key()); f != nil {
		t.Errorf("a successful creation kept the failure record %+v", f)
	}
}

// One by hand is not held back by the record of an automatic failure.
func TestCreateByHandAfterFailure(t *testing.T) {
	ctx := context.Background()
	s := Open(t.TempDir())
	shape := testShape()
	bad := newBuild(shape)
	bad.err = errors.New("boom")
	s.Create(ctx, shape, CreateOptions{Automatic: true}, bad.build)
	if s.Failure(shape.Key()) == nil {
		t.Fatal("no failure record")
	}
	good := newBuild(shape)
	if _, created, err := s.Create(ctx, shape, CreateOptions{}, good.build); err != nil || !created {
		t.Fatalf("create by hand after an automatic failure: created %v, %v", created, err)
	}
	if s.Failure(shape.Key()) != nil {
		t.Error("the failure record outlived a successful creation")
	}
}

func TestCreateUnreadableFailureRecord(t *testing.T) {
	s := Open(t.TempDir())
	os.MkdirAll(s.Dir(), 0o700)
	key := testShape().Key()
	os.WriteFile(filepath.Join(s.Dir(), key+failedSuffix), []byte("not json"), 0o600)
	if f := s.Failure(key); f == nil || f.Error != "unreadable record" {
		t.Errorf("failure of an unreadable record: %+v", f)
	}
	if f := s.Failure(strings.Repeat("0", 32)); f != nil {
		t.Errorf("failure of a key with no record: %+v", f)
	}
}

// A build that leaves a template Load would refuse (here: a machine of
// another size than the shape) fails the creation: what is put in place
// must load, or every sandbox would pass it over and ask for it anew.
func TestCreateUnloadable(t *testing.T) {
	s := Open(t.TempDir())
	shape := testShape()
	b := newBuild(shape)
	b.machine = &checkpoint.Machine{Driver: "qemu", VCPUs: 4, MemoryMiB: shape.MemoryMiB}
	_, _, err := s.Create(context.Background(), shape, CreateOptions{Automatic: true}, b.build)
	if err == nil || !strings.Contains(err.Error(), "machine does not match") {
		t.Fatalf("create of a template that would not load: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(s.Dir(), shape.Key())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the template was put in place: %v", err)
	}
	if s.Failure(shape.Key()) == nil {
		t.Error("the failure was not recorded")
	}
	// Nor a memory file the build grew.
	grow := func(ctx context.Context, b Build) (Built, error) {
		built, err := newBuild(shape).build(ctx, b)
		if err == nil {
			err = os.Truncate(b.Memory, 2<<20)
		}
		return built, err
	}
	_, _, err = s.Create(context.Background(), shape, CreateOptions{}, grow)
	if err == nil || !strings.Contains(err.Error(), "memory file of 2097152 bytes") {
		t.Errorf("create of a template whose memory file grew: %v", err)
	}
}

func TestCreateNoWaitBusy(t *testing.T) {
	s := Open(t.TempDir())
	shape := testShape()
	if s.Creating() {
		t.Error("a store that does not exist says a creation runs")
	}
	holdLock(t, s)
	if !s.Creating() {
		t.Error("Creating does not see the lock held")
	}
	b := newBuild(shape)
	_, _, err := s.Create(context.Background(), shape, CreateOptions{NoWait: true, Automatic: true}, b.build)
	if !errors.Is(err, ErrBusy) {
		t.Errorf("create with the lock held elsewhere: %v, want ErrBusy", err)
	}
	if b.calls.Load() != 0 || s.Failure(shape.Key()) != nil {
		t.Errorf("a busy creation built (%d) or recorded a failure", b.calls.Load())
	}
	// Without NoWait it waits, for as long as its context lasts.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _, err = s.Create(ctx, shape, CreateOptions{}, b.build)
	if !errors.Is(err, context.DeadlineExceeded) || b.calls.Load() != 0 {
		t.Errorf("create waiting for the lock: %v, %d builds", err, b.calls.Load())
	}
}

func TestCreateConcurrent(t *testing.T) {
	s := Open(t.TempDir())
	shape := testShape()
	b := newBuild(shape)
	b.delay = 300 * time.Millisecond
	const n = 4
	var wg sync.WaitGroup
	keys, created, errs := make([]string, n), make([]bool, n), make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tpl, c, err := s.Create(context.Background(), shape, CreateOptions{}, b.build)
			created[i], errs[i] = c, err
			if err == nil {
				keys[i] = tpl.Key()
			}
		}()
	}
	wg.Wait()
	if b.calls.Load() != 1 {
		t.Errorf("%d concurrent creations built %d times, want once", n, b.calls.Load())
	}
	made := 0
	for i := range n {
		if errs[i] != nil || keys[i] != shape.Key() {
			t.Errorf("creation %d: key %s, %v", i, keys[i], errs[i])
		}
		if created[i] {
			made++
		}
	}
	if made != 1 {
		t.Errorf("%d creations say they made the template", made)
	}
}

func TestGC(t *testing.T) {
	ctx := context.Background()
	s := Open(t.TempDir())
	cur := testShape()
	current := Current{Guest: cur.Guest, VMM: cur.VMM, VMMID: cur.VMMID}

	mustCreate(t, s, cur)
	corrupt := testShape()
	corrupt.VCPUs = 2
	ct := mustCreate(t, s, corrupt)
	f, _ := os.OpenFile(ct.MemoryPath(), os.O_WRONLY, 0)
	f.WriteAt([]byte{1}, 0)
	f.Close()
	oldGuest := testShape()
	oldGuest.MemoryMiB = 2
	oldGuest.Guest = checkpoint.GuestImage{Version: "6.1.0-old", Kernel: "sha256:" + strings.Repeat("d", 64), Initrd: cur.Guest.Initrd}
	mustCreate(t, s, oldGuest)
	oldVMM := testShape()
	oldVMM.Accel = "kvm"
	oldVMM.VMMID = "dev=1,ino=9,size=3,mtime=4"
	mustCreate(t, s, oldVMM)
	// A failure past its backoff goes; a recent one stays, holding the
	// automatic retry back.
	failed := strings.Repeat("e", 32) + failedSuffix
	writeJSON(filepath.Join(s.Dir(), failed), Failure{Time: time.Now().Add(-FailureBackoff - time.Minute), Error: "boom"})
	recent := strings.Repeat("f", 32) + failedSuffix
	writeJSON(filepath.Join(s.Dir(), recent), Failure{Time: time.Now(), Error: "boom"})
	leftover := tmpPrefix + cur.Key() + "-123"
	os.MkdirAll(filepath.Join(s.Dir(), leftover, "x"), 0o700)
	os.WriteFile(filepath.Join(s.Dir(), LogName), []byte("log\n"), 0o600)

	removed, err := s.GC(ctx, current)
	if err != nil {
		t.Fatalf("gc: %v", err)
	}
	got := map[string]string{}
	for _, r := range removed {
		got[r.Name] = r.Reason
	}
	for name, reason := range map[string]string{
		corrupt.Key():  "sha256",
		oldGuest.Key(): "made for guest image 6.1.0-old kernel sha256:dddd",
		oldVMM.Key():   "made with VMM /usr/bin/qemu-system-x86_64 (dev=1,ino=9,size=3,mtime=4)",
		failed:         "failed creation",
		leftover:       "interrupted",
	} {
		if !strings.Contains(got[name], reason) {
			t.Errorf("gc removed %s for %q, want a reason saying %q", name, got[name], reason)
		}
	}
	if len(removed) != 5 {
		t.Errorf("gc removed %d things: %+v", len(removed), removed)
	}
	if names := storeNames(t, s); fmt.Sprint(names) != fmt.Sprint([]string{lockName, cur.Key(), LogName, recent}) {
		t.Errorf("the store holds %q after gc", names)
	}
	if _, err := s.Lookup(cur); err != nil {
		t.Errorf("gc broke the current template: %v", err)
	}
	// Nothing more to do.
	if removed, err := s.GC(ctx, current); err != nil || len(removed) != 0 {
		t.Errorf("second gc: %+v, %v", removed, err)
	}
	// A VMM that is not known keeps templates of any VMM.
	mustCreate(t, s, oldVMM)
	if removed, err := s.GC(ctx, Current{Guest: cur.Guest}); err != nil || len(removed) != 0 {
		t.Errorf("gc with no VMM: %+v, %v", removed, err)
	}
}

// A creation running elsewhere keeps GC off the leftovers, which may be
// its own.
func TestGCCreationRunning(t *testing.T) {
	s := Open(t.TempDir())
	cur := testShape()
	mustCreate(t, s, cur)
	leftover := filepath.Join(s.Dir(), tmpPrefix+"in-progress")
	os.Mkdir(leftover, 0o700)
	holdLock(t, s)
	removed, err := s.GC(context.Background(), Current{Guest: cur.Guest, VMM: cur.VMM, VMMID: cur.VMMID})
	if err != nil || len(removed) != 0 {
		t.Errorf("gc during a creation: %+v, %v", removed, err)
	}
	if _, err := os.Stat(leftover); err != nil {
		t.Errorf("gc removed the leftover of a running creation: %v", err)
	}
}

func TestGCEmpty(t *testing.T) {
	s := Open(t.TempDir())
	if removed, err := s.GC(context.Background(), Current{}); err != nil || len(removed) != 0 {
		t.Errorf("gc of a store never made: %+v, %v", removed, err)
	}
	if _, err := os.Stat(s.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gc made the store: %v", err)
	}
}

func TestSpawn(t *testing.T) {
	s := Open(t.TempDir())
	logPath := filepath.Join(s.Dir(), LogName)
	// A log over its bound is cut before the child appends to it.
	os.MkdirAll(s.Dir(), 0o700)
	os.WriteFile(logPath, make([]byte, maxLogBytes+1), 0o600)
	pid, err := s.Spawn("/bin/sh", []string{"-c", `echo "session $(cut -d" " -f6 /proc/$$/stat) of $$"; echo err >&2`})
	if err != nil || pid <= 0 {
		t.Fatalf("spawn: %d, %v", pid, err)
	}
	want := fmt.Sprintf("session %d of %d\nerr\n", pid, pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(logPath)
		if string(data) == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log holds %q, want %q", data, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := s.Spawn(filepath.Join(t.TempDir(), "missing"), nil); err == nil {
		t.Error("spawn of a missing executable succeeded")
	}
}
