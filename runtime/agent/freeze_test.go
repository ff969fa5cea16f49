//go:build linux

package agent

import (
	"context"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	guestagent "github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/api"
)

// recordingFreezer is a guest Freezer that records what it was asked to
// freeze and thaw: the test machine's filesystems are left alone.
type recordingFreezer struct {
	mu    sync.Mutex // guards calls
	calls []string
}

func (f *recordingFreezer) Sync() {}

func (f *recordingFreezer) Freeze(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "freeze "+path)
	return nil
}

func (f *recordingFreezer) Thaw(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "thaw "+path)
	return nil
}

func (f *recordingFreezer) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// scratchRootfs is agenttest's directory root whose root directory stands
// for a scratch disk's mount.
type scratchRootfs struct{ agenttest.DirRootfs }

func (r scratchRootfs) Assemble(ctx context.Context, dir string, rootfs *api.Rootfs) (*guestagent.Mounted, error) {
	m, err := r.DirRootfs.Assemble(ctx, dir, rootfs)
	if err != nil {
		return nil, err
	}
	m.Scratch = m.Root
	return m, nil
}

func TestClientFreezeThaw(t *testing.T) {
	fz := &recordingFreezer{}
	c := newContainerHarness(t, guestagent.Config{Freezer: fz, Rootfs: scratchRootfs{}})
	ctx := testCtx(t, time.Minute)

	if n, err := c.FreezeFilesystems(ctx); err != nil || n != 0 {
		t.Fatalf("freeze without containers: %d, %v", n, err)
	}
	if err := c.ThawFilesystems(ctx); err != nil {
		t.Fatal(err)
	}
	init, err := c.CreateContainer(ctx, ContainerCreate{ID: "frozen", ProcessID: "f1", Spec: mustJSON(t, agenttest.Spec(false, "sleep", "1000")), Rootfs: oneLayer})
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.FreezeFilesystems(ctx)
	if err != nil || n != 1 {
		t.Fatalf("freeze: %d, %v", n, err)
	}
	calls := fz.take()
	if len(calls) != 1 || !strings.HasPrefix(calls[0], "freeze /") || !strings.HasSuffix(calls[0], "/frozen/rootfs") {
		t.Fatalf("freeze calls %q", calls)
	}
	root := strings.TrimPrefix(calls[0], "freeze ")
	if n, err := c.FreezeFilesystems(ctx); err != nil || n != 1 || len(fz.take()) != 0 {
		t.Fatalf("freeze again: %d, %v", n, err)
	}

	_, err = c.CreateContainer(ctx, ContainerCreate{ID: "later", ProcessID: "f2", Spec: mustJSON(t, agenttest.Spec(false, "true")), Rootfs: oneLayer})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "filesystems are frozen for a snapshot") {
		t.Fatalf("create while frozen: %v", err)
	}
	if err := c.KillContainer(ctx, "frozen", syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	if _, err := init.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteContainer(ctx, "frozen"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete while frozen: %v", err)
	}

	if err := c.ThawFilesystems(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := fz.take(), []string{"thaw " + root}; !slices.Equal(got, want) {
		t.Fatalf("thaw calls %q, want %q", got, want)
	}
	if err := c.ThawFilesystems(ctx); err != nil || len(fz.take()) != 0 {
		t.Fatalf("thaw again: %v", err)
	}
	if err := c.DeleteContainer(ctx, "frozen"); err != nil {
		t.Fatalf("delete after thaw: %v", err)
	}
}
