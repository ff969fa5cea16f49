//go:build linux

package agent

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/api"
)

// fakeFreezer records the freezes and thaws asked for, and fails those
// named in failFreeze and failThaw (once each).
type fakeFreezer struct {
	mu         sync.Mutex // guards the fields below
	calls      []string
	failFreeze map[string]bool
	failThaw   map[string]bool
}

func (f *fakeFreezer) Sync() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "sync")
}

func (f *fakeFreezer) Freeze(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failFreeze[path] {
		delete(f.failFreeze, path)
		return errors.New("fake freeze failure")
	}
	f.calls = append(f.calls, "freeze "+path)
	return nil
}

func (f *fakeFreezer) Thaw(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failThaw[path] {
		delete(f.failThaw, path)
		return errors.New("fake thaw failure")
	}
	f.calls = append(f.calls, "thaw "+path)
	return nil
}

// take returns the calls so far and forgets them.
func (f *fakeFreezer) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// freezeService is a Service whose containers are fakes with scratch
// disks at /scratch/a and /scratch/b (and c with none), never run.
func freezeService(t *testing.T, fz *fakeFreezer) *Service {
	t.Helper()
	s := newService(t, Config{Freezer: fz})
	for id, scratch := range map[string]string{"a": "/scratch/a", "b": "/scratch/b", "c": ""} {
		s.containers.byID[id] = &container{id: id, rootfs: &Mounted{Scratch: scratch}, freeze: s.freeze, state: stateStopped}
	}
	return s
}

func isFrozenRefusal(err error) bool {
	return errdefs.IsFailedPrecondition(err) && strings.Contains(err.Error(), "filesystems are frozen for a snapshot")
}

func TestFreezeThaw(t *testing.T) {
	fz := &fakeFreezer{}
	s := freezeService(t, fz)
	ctx := context.Background()

	resp, err := s.FreezeFilesystems(ctx, &api.Empty{})
	if err != nil || resp.Frozen != 2 {
		t.Fatalf("freeze: %v, %v", resp, err)
	}
	if got, want := fz.take(), []string{"sync", "freeze /scratch/a", "freeze /scratch/b"}; !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	// Twice: nothing more, the same count.
	resp, err = s.FreezeFilesystems(ctx, &api.Empty{})
	if err != nil || resp.Frozen != 2 {
		t.Fatalf("freeze again: %v, %v", resp, err)
	}
	if got := fz.take(); len(got) != 0 {
		t.Fatalf("second freeze made calls %q", got)
	}

	// Nothing mounts, unmounts or reads a writable layer meanwhile, and
	// the refusal is immediate.
	_, err = s.CreateContainer(ctx, &api.CreateContainerRequest{
		ContainerId: "d", ProcessId: "d", Spec: []byte(`{"process":{"args":["true"]},"linux":{}}`),
		Rootfs: &api.Rootfs{Layers: []*api.Disk{{Fstype: "erofs", ReadOnly: true}}},
	})
	if !isFrozenRefusal(err) {
		t.Fatalf("create while frozen: want the frozen refusal, got %v", err)
	}
	if _, err := s.DeleteContainer(ctx, &api.ContainerRequest{ContainerId: "a"}); !isFrozenRefusal(err) {
		t.Fatalf("delete while frozen: want the frozen refusal, got %v", err)
	}
	if _, err := s.ExportLayer(ctx, &api.ExportLayerRequest{ContainerId: "b", StreamId: "x"}); !isFrozenRefusal(err) {
		t.Fatalf("export while frozen: want the frozen refusal, got %v", err)
	}
	// The refused ops left the containers as they were.
	if st := s.containers.byID["a"]; st.busy != "" {
		t.Fatalf("container a left busy %q", st.busy)
	}

	if _, err := s.ThawFilesystems(ctx, &api.Empty{}); err != nil {
		t.Fatal(err)
	}
	if got, want := fz.take(), []string{"thaw /scratch/a", "thaw /scratch/b"}; !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	// Idempotent.
	if _, err := s.ThawFilesystems(ctx, &api.Empty{}); err != nil {
		t.Fatal(err)
	}
	if got := fz.take(); len(got) != 0 {
		t.Fatalf("second thaw made calls %q", got)
	}
}

func TestFreezeFailureThawsWhatItFroze(t *testing.T) {
	fz := &fakeFreezer{failFreeze: map[string]bool{"/scratch/b": true}}
	s := freezeService(t, fz)
	ctx := context.Background()
	if _, err := s.FreezeFilesystems(ctx, &api.Empty{}); err == nil || !strings.Contains(err.Error(), "/scratch/b") {
		t.Fatalf("want the failure of /scratch/b, got %v", err)
	}
	if got, want := fz.take(), []string{"sync", "freeze /scratch/a", "thaw /scratch/a"}; !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	// Not frozen: a thaw has nothing to do, a freeze starts over.
	if _, err := s.ThawFilesystems(ctx, &api.Empty{}); err != nil || len(fz.take()) != 0 {
		t.Fatalf("thaw after a failed freeze: %v", err)
	}
	if resp, err := s.FreezeFilesystems(ctx, &api.Empty{}); err != nil || resp.Frozen != 2 {
		t.Fatalf("freeze again: %v, %v", resp, err)
	}
}

func TestThawFailureStaysFrozen(t *testing.T) {
	fz := &fakeFreezer{failThaw: map[string]bool{"/scratch/a": true}}
	s := freezeService(t, fz)
	ctx := context.Background()
	if _, err := s.FreezeFilesystems(ctx, &api.Empty{}); err != nil {
		t.Fatal(err)
	}
	fz.take()
	if _, err := s.ThawFilesystems(ctx, &api.Empty{}); err == nil {
		t.Fatal("thaw: want the failure of /scratch/a")
	}
	if got, want := fz.take(), []string{"thaw /scratch/b"}; !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	// Still frozen as far as the rest of the agent knows, with the one
	// left to thaw.
	if resp, err := s.FreezeFilesystems(ctx, &api.Empty{}); err != nil || resp.Frozen != 1 {
		t.Fatalf("freeze while partly frozen: %v, %v", resp, err)
	}
	if _, err := s.DeleteContainer(ctx, &api.ContainerRequest{ContainerId: "a"}); !isFrozenRefusal(err) {
		t.Fatalf("delete: want the frozen refusal, got %v", err)
	}
	if _, err := s.ThawFilesystems(ctx, &api.Empty{}); err != nil {
		t.Fatal(err)
	}
	if got, want := fz.take(), []string{"thaw /scratch/a"}; !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
}

func TestFreezeRefusedWhileContainerChanges(t *testing.T) {
	fz := &fakeFreezer{}
	s := freezeService(t, fz)
	ctx := context.Background()
	c := s.containers.byID["a"]
	if err := c.begin(opDelete); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FreezeFilesystems(ctx, &api.Empty{}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("freeze during a delete: want failed precondition, got %v", err)
	}
	if got := fz.take(); len(got) != 0 {
		t.Fatalf("refused freeze made calls %q", got)
	}
	c.end(opDelete, false)
	if resp, err := s.FreezeFilesystems(ctx, &api.Empty{}); err != nil || resp.Frozen != 2 {
		t.Fatalf("freeze after the delete: %v, %v", resp, err)
	}
}

func TestLinuxThawOfUnfrozenIsFine(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("FITHAW needs CAP_SYS_ADMIN")
	}
	// FITHAW only: freezing the test machine's filesystem is not a test.
	if err := (LinuxFreezer{}).Thaw(t.TempDir()); err != nil {
		t.Fatalf("thaw of a filesystem that is not frozen: %v", err)
	}
}

// TestDeleteWaitsForExecsSettling: a delete that finds a process still
// being executed in the container waits for that call to finish, and one
// whose call does not finish within execSettle is refused.
func TestDeleteWaitsForExecsSettling(t *testing.T) {
	s := freezeService(t, &fakeFreezer{})
	c := s.containers.byID["a"]
	c.mu.Lock()
	c.execs = 1
	c.mu.Unlock()
	time.AfterFunc(100*time.Millisecond, func() {
		c.mu.Lock()
		c.execs--
		c.mu.Unlock()
	})
	began := time.Now()
	if err := c.begin(opDelete); err != nil {
		t.Fatalf("delete after the exec settled: %v", err)
	}
	if d := time.Since(began); d < 100*time.Millisecond {
		t.Errorf("the delete began %v after an exec in progress, before it settled", d)
	}
	c.end(opDelete, false)

	c.mu.Lock()
	c.execs = 1
	c.mu.Unlock()
	if err := c.begin(opExport); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "starting a process") {
		t.Fatalf("export while an exec never settles: %v", err)
	}
}
