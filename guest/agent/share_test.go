//go:build linux

package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// fakeShare stands in for the virtio-fs mount: it counts mounts, fails
// while fail is set, and makes the files the share would hold.
type fakeShare struct {
	mu     sync.Mutex // guards the fields below
	mounts int
	fail   error
	files  []string
}

func (f *fakeShare) MountShare(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.mounts++
	for _, name := range f.files {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeShare) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mounts
}

func specWithMounts(mounts ...specs.Mount) *specs.Spec {
	return &specs.Spec{Version: "1.1.0", Process: &specs.Process{Args: []string{"true"}}, Linux: &specs.Linux{}, Mounts: mounts}
}

func TestBindMounts(t *testing.T) {
	spec := specWithMounts(
		specs.Mount{Destination: "/proc", Type: "proc", Source: "proc"},
		specs.Mount{Destination: "/a", Type: "bind", Source: "/src/a"},
		specs.Mount{Destination: "/b", Type: "none", Source: "/src/b", Options: []string{"rbind", "ro"}},
		specs.Mount{Destination: "/c", Source: "/src/c", Options: []string{"bind"}},
		specs.Mount{Destination: "/d", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid"}},
	)
	got, err := bundleOf(t, spec).bindMounts()
	if err != nil {
		t.Fatal(err)
	}
	want := []bindMount{{"/a", "/src/a"}, {"/b", "/src/b"}, {"/c", "/src/c"}}
	if !slices.Equal(got, want) {
		t.Errorf("bind mounts %v, want %v", got, want)
	}
}

func TestSharedDirUnder(t *testing.T) {
	d := &sharedDir{root: "/run/cocoon/shared"}
	for src, want := range map[string]bool{
		"/run/cocoon/shared":              true,
		"/run/cocoon/shared/":             true,
		"/run/cocoon/shared/c1/vol":       true,
		"/run/cocoon/shared//c1/./vol":    true,
		"/run/cocoon/sharedx/vol":         false,
		"/run/cocoon/shared/../oci":       false,
		"/run/cocoon":                     false,
		"run/cocoon/shared/vol":           false,
		"/var/lib/data":                   false,
		"/run/cocoon/shared/../shared/ok": true,
	} {
		if got := d.under(src); got != want {
			t.Errorf("under(%q) = %v, want %v", src, got, want)
		}
	}
}

// TestSharedDirPrepare: the share is mounted once, when the first
// container with a bind mount from it comes, on a mount point made 0700;
// a container without one mounts nothing; a source the share lacks and a
// share that cannot be mounted fail clearly, and a failed mount is tried
// again by the next container.
func TestSharedDirPrepare(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "run", "cocoon", "shared")
	fs := &fakeShare{files: []string{"c1/vol", "c2/vol"}}
	d := &sharedDir{root: root, m: fs}

	plain := bundleOf(t, specWithMounts(specs.Mount{Destination: "/data", Type: "bind", Source: "/var/lib/data"}))
	if err := d.prepare(ctx, "plain", plain); err != nil || fs.count() != 0 {
		t.Fatalf("a container without shared mounts: %v, %d mounts", err, fs.count())
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount point made for nothing: %v", err)
	}

	fs.fail = errors.New("no such device")
	c1 := bundleOf(t, specWithMounts(specs.Mount{Destination: "/vol", Type: "bind", Source: root + "/c1/vol"}))
	err := d.prepare(ctx, "c1", c1)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "container c1: mount the directory the host shares (virtio-fs tag cocoon-shared) on "+root+": ") ||
		!strings.Contains(err.Error(), "no such device") {
		t.Fatalf("failed mount: %v", err)
	}
	fi, err := os.Stat(root)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("mount point: %v, %v", fi, err)
	}

	fs.fail = nil
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = d.prepare(ctx, "c1", c1) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	c2 := bundleOf(t, specWithMounts(specs.Mount{Destination: "/vol", Type: "none", Source: root + "/c2/vol", Options: []string{"rbind"}}))
	if err := d.prepare(ctx, "c2", c2); err != nil {
		t.Fatal(err)
	}
	if n := fs.count(); n != 1 {
		t.Errorf("%d mounts, want one for the guest", n)
	}

	missing := bundleOf(t, specWithMounts(
		specs.Mount{Destination: "/vol", Type: "bind", Source: root + "/c2/vol"},
		specs.Mount{Destination: "/other", Type: "bind", Source: root + "/c3/vol"},
	))
	err = d.prepare(ctx, "c3", missing)
	if !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "container c3: bind mount on /other: its source "+root+"/c3/vol is not in the directory the host shares") {
		t.Errorf("missing source: %v", err)
	}
}
