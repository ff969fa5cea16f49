package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// prepareOne prepares a read-only root of one layer directory for a new
// container directory.
func prepareOne(t *testing.T, c *Cache, layer string) Rootfs {
	t.Helper()
	r, err := c.Prepare(context.Background(), []Mount{{Type: "bind", Source: layer, Options: []string{"ro"}}}, filepath.Join(t.TempDir(), "ctr"))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func gc(t *testing.T, c *Cache, opts GCOptions) (int, int64) {
	t.Helper()
	n, freed, err := c.GC(context.Background(), opts)
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	return n, freed
}

func TestGCKeepsReferencedLayers(t *testing.T) {
	needTools(t)
	c := openCache(t)
	layer := t.TempDir()
	writeManyFiles(t, layer, 20, 8<<10)
	r := prepareOne(t, c, layer)

	if n, _ := gc(t, c, GCOptions{MinIdle: -1}); n != 0 {
		t.Fatalf("GC removed %d images in use", n)
	}
	// Even with its snapshot gone, a layer in use stays.
	other := filepath.Join(t.TempDir(), "fs")
	writeFile(t, filepath.Join(other, "f"), "x")
	ro := prepareOne(t, c, other)
	must(t, os.RemoveAll(other))
	if n, _ := gc(t, c, GCOptions{}); n != 0 {
		t.Fatalf("GC removed %d images in use", n)
	}
	must(t, c.Release(context.Background(), ro))
	if n, _ := gc(t, c, GCOptions{}); n != 1 {
		t.Fatalf("GC removed %d images, want the released one whose snapshot is gone", n)
	}

	// Released but recently used, and its snapshot still there: kept
	// for MinIdle.
	must(t, c.Release(context.Background(), r))
	if n, _ := gc(t, c, GCOptions{}); n != 0 {
		t.Fatalf("GC removed a layer used moments ago")
	}
	var removed []Layer
	n, freed := gc(t, c, GCOptions{MinIdle: -1, Removed: func(l Layer) { removed = append(removed, l) }})
	if n != 1 || freed < 20*8<<10 || len(removed) != 1 || removed[0].Source != layer {
		t.Fatalf("GC removed %d (%d bytes): %+v", n, freed, removed)
	}
	assertCacheEmpty(t, c)
}

func TestGCDropsStaleReferences(t *testing.T) {
	needTools(t)
	c := openCache(t)
	layer := t.TempDir()
	writeFile(t, filepath.Join(layer, "f"), "x")
	r := prepareOne(t, c, layer)

	// The container's directory disappears without Release (its shim
	// crashed and `cocoon gc` removed the sandbox): the reference is
	// stale. The snapshot still exists, so the image waits MinIdle.
	must(t, os.RemoveAll(r.Dir))
	if n, _ := gc(t, c, GCOptions{}); n != 0 {
		t.Fatal("removed before MinIdle")
	}
	key, _ := c.keyOf(r.Layers[0])
	if refs, _ := os.ReadDir(c.keyRefsDir(key)); len(refs) != 0 {
		t.Fatalf("stale reference kept")
	}
	if n, _ := gc(t, c, GCOptions{MinIdle: -1}); n != 1 {
		t.Fatalf("removed %d", n)
	}

	// A Live function overrides the directory check.
	r = prepareOne(t, c, layer)
	if n, _ := gc(t, c, GCOptions{MinIdle: -1, Live: func(string) bool { return true }}); n != 0 {
		t.Fatal("removed a layer Live says is in use")
	}
	if n, _ := gc(t, c, GCOptions{MinIdle: -1, Live: func(dir string) bool { return dir != r.Dir }}); n != 1 {
		t.Fatal("kept a layer whose only owner is not live")
	}
	assertCacheEmpty(t, c)
}

func TestGCRemovesLayersOfDeletedSnapshots(t *testing.T) {
	needTools(t)
	c := openCache(t)
	layer := filepath.Join(t.TempDir(), "fs")
	writeFile(t, filepath.Join(layer, "f"), "x")
	r := prepareOne(t, c, layer)
	must(t, c.Release(context.Background(), r))
	// containerd removed the image: its snapshot can never be asked for
	// again, so no grace period applies.
	must(t, os.RemoveAll(layer))
	if n, _ := gc(t, c, GCOptions{MinIdle: time.Hour}); n != 1 {
		t.Fatalf("removed %d", n)
	}
	// A new directory at the same path is not the old snapshot.
	writeFile(t, filepath.Join(layer, "f"), "x")
	r = prepareOne(t, c, layer)
	must(t, c.Release(context.Background(), r))
	must(t, os.RemoveAll(layer))
	writeFile(t, filepath.Join(layer, "other"), "y")
	if n, _ := gc(t, c, GCOptions{MinIdle: time.Hour}); n != 1 {
		t.Fatalf("removed %d", n)
	}
	assertCacheEmpty(t, c)
}

func TestGCCleansLeftovers(t *testing.T) {
	c := openCache(t)
	old := time.Now().Add(-time.Hour)
	key := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, p := range []string{
		filepath.Join(c.tmpDir(), key+".123.erofs"), // an interrupted build
		c.infoPath(key), // a record without image
		filepath.Join(c.keyRefsDir(key), ownerName("/gone")), // references without image
		c.keyLockPath(key),
	} {
		writeFile(t, p, "/gone\n")
		os.Chtimes(p, old, old)
	}
	young := filepath.Join(c.tmpDir(), "young.erofs")
	writeFile(t, young, "")
	if n, _ := gc(t, c, GCOptions{}); n != 0 {
		t.Fatalf("removed %d images from an empty cache", n)
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("young tmp file removed: %v", err)
	}
	must(t, os.Remove(young))
	assertCacheEmpty(t, c)
}

func TestGCWaitsForPrepare(t *testing.T) {
	c := openCache(t)
	// A Prepare in progress holds the cache lock shared.
	lk, err := lockFile(context.Background(), c.lockPath(), unix.LOCK_SH)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := c.GC(ctx, GCOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("GC during a Prepare: %v", err)
	}
	lk.Unlock()
	gc(t, c, GCOptions{})
}

func assertCacheEmpty(t *testing.T, c *Cache) {
	t.Helper()
	for _, d := range []string{c.imagesDir(), c.refsDir(), c.locksDir(), c.tmpDir()} {
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%s holds %q", d, names)
		}
	}
}
