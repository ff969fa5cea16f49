package rootfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// These tests run the real mkfs.erofs and mkfs.ext4 and skip, saying so,
// when they are missing. Those that check file ownership, whiteouts and
// the assembled overlay need root and loop devices, and skip without them.

func needTools(t *testing.T) {
	t.Helper()
	if err := CheckTools(); err != nil {
		t.Skipf("layer tools missing: %v", err)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (file owners, whiteout devices, trusted xattrs, mounts)")
	}
}

func openCache(t *testing.T) *Cache {
	t.Helper()
	c, err := Open(filepath.Join(t.TempDir(), "layers"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// logCounter collects the messages logged through a context.
type logCounter struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logCounter) Levels() []logrus.Level { return logrus.AllLevels }
func (l *logCounter) Fire(e *logrus.Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, e.Message)
	return nil
}

func (l *logCounter) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// countingContext returns a context whose logger records messages.
func countingContext(t *testing.T) (context.Context, *logCounter) {
	lc := &logCounter{}
	l := logrus.New()
	l.SetOutput(testWriter{t})
	l.SetLevel(logrus.DebugLevel)
	l.AddHook(lc)
	return log.WithLogger(context.Background(), logrus.NewEntry(l)), lc
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// overlayMounts is what containerd's overlayfs snapshotter returns for a
// container on lowers (given lowest first, as Rootfs lists them).
func overlayMounts(upper, work string, lowers ...string) []Mount {
	top := make([]string, len(lowers))
	for i, l := range lowers {
		top[len(lowers)-1-i] = l
	}
	return []Mount{{Type: "overlay", Source: "overlay", Options: []string{
		"index=off", "workdir=" + work, "upperdir=" + upper, "lowerdir=" + strings.Join(top, ":"),
	}}}
}

func TestPrepareReleaseOverlay(t *testing.T) {
	needTools(t)
	ctx, logs := countingContext(t)
	c := openCache(t)
	snap := t.TempDir()
	l1, l2 := filepath.Join(snap, "1/fs"), filepath.Join(snap, "2/fs")
	writeFile(t, filepath.Join(l1, "etc/os-release"), "ID=base\n")
	writeFile(t, filepath.Join(l2, "app/run"), "run")
	upper, work := filepath.Join(snap, "3/fs"), filepath.Join(snap, "3/work")
	os.MkdirAll(upper, 0o755)
	os.MkdirAll(work, 0o755)

	dirA := filepath.Join(t.TempDir(), "ctr-a")
	r, err := c.Prepare(ctx, overlayMounts(upper, work, l1, l2), dirA)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Layers) != 2 || r.Scratch != filepath.Join(dirA, ScratchFile) || r.Dir != dirA || r.ReadOnly() {
		t.Fatalf("rootfs = %+v", r)
	}
	for i, want := range []string{l1, l2} {
		key, _ := c.keyOf(r.Layers[i])
		l, err := c.readInfo(key)
		if err != nil || l.Source != want {
			t.Errorf("layer %d built from %q (%v), want %q: lowest first", i, l.Source, err, want)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(r.Scratch, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != DefaultScratchSize || st.Blocks*512 > 16<<20 || st.Mode&0o777 != 0o600 {
		t.Errorf("scratch: size %d, %d bytes allocated, mode %o; want sparse %d bytes, 0600", st.Size, st.Blocks*512, st.Mode&0o777, DefaultScratchSize)
	}
	if n := logs.count("layer image built"); n != 2 {
		t.Errorf("built %d images, want 2", n)
	}

	// A second container on the same image: both layers from the cache.
	dirB := filepath.Join(t.TempDir(), "ctr-b")
	rb, err := c.Prepare(ctx, overlayMounts(upper, work, l1, l2), dirB, WithScratchSize(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	if n := logs.count("layer image built"); n != 2 {
		t.Errorf("second prepare built images: %d builds in all", n)
	}
	if strings.Join(rb.Layers, ",") != strings.Join(r.Layers, ",") {
		t.Errorf("layers differ: %q vs %q", rb.Layers, r.Layers)
	}
	if fi, err := os.Stat(rb.Scratch); err != nil || fi.Size() != 64<<20 {
		t.Errorf("scratch with WithScratchSize: %v %v", fi, err)
	}
	for _, img := range r.Layers {
		key, _ := c.keyOf(img)
		if refs, _ := os.ReadDir(c.keyRefsDir(key)); len(refs) != 2 {
			t.Errorf("layer %s has %d references, want 2", key[:12], len(refs))
		}
	}

	// A layer that changes is never served stale: it gets a new image.
	writeFile(t, filepath.Join(l2, "app/run"), "new")
	dirC := filepath.Join(t.TempDir(), "ctr-c")
	rc, err := c.Prepare(ctx, overlayMounts(upper, work, l1, l2), dirC)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Layers[0] != r.Layers[0] || rc.Layers[1] == r.Layers[1] {
		t.Errorf("after changing layer 2: layers %q, before %q", rc.Layers, r.Layers)
	}

	// A dir that holds a scratch disk is refused.
	if _, err := c.Prepare(ctx, overlayMounts(upper, work, l1), dirA); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("prepare into a used dir: %v", err)
	}

	for _, rr := range []Rootfs{r, rb, rc} {
		if err := c.Release(ctx, rr); err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx, rr); err != nil {
			t.Fatalf("second release: %v", err)
		}
		if _, err := os.Stat(rr.Scratch); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("scratch %s still there: %v", rr.Scratch, err)
		}
	}
	ents, _ := os.ReadDir(c.refsDir())
	for _, e := range ents {
		if refs, _ := os.ReadDir(filepath.Join(c.refsDir(), e.Name())); len(refs) != 0 {
			t.Errorf("layer %s still referenced after release", e.Name())
		}
	}
	if tmp, _ := os.ReadDir(c.tmpDir()); len(tmp) != 0 {
		t.Errorf("tmp holds %d files", len(tmp))
	}
}

func TestPrepareBindMounts(t *testing.T) {
	needTools(t)
	ctx := context.Background()
	c := openCache(t)
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "bin/true"), "x")
	os.Chmod(src, 0o751)

	ro, err := c.Prepare(ctx, []Mount{{Type: "bind", Source: src, Options: []string{"ro", "rbind"}}}, filepath.Join(t.TempDir(), "ro"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ro.Layers) != 1 || !ro.ReadOnly() {
		t.Fatalf("ro bind: %+v", ro)
	}
	rw, err := c.Prepare(ctx, []Mount{{Type: "bind", Source: src, Options: []string{"rbind", "rw"}}}, filepath.Join(t.TempDir(), "rw"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rw.Layers) != 1 || rw.Layers[0] != ro.Layers[0] || rw.ReadOnly() {
		t.Fatalf("rw bind: %+v", rw)
	}
	// The upperdir takes the root's mode, as overlayfs shows the
	// upperdir's mode for the merged root.
	out, err := exec.Command("debugfs", "-R", "stat /"+ScratchUpperDir, rw.Scratch).CombinedOutput()
	if err != nil {
		t.Skipf("debugfs: %v", err)
	}
	if !strings.Contains(string(out), "Mode:  0751") && !strings.Contains(string(out), "Mode: 0751") {
		t.Errorf("scratch upperdir:\n%s", out)
	}
}

func TestPrepareFailureLeavesNothing(t *testing.T) {
	needTools(t)
	ctx := context.Background()
	c := openCache(t)
	good := t.TempDir()
	writeFile(t, filepath.Join(good, "f"), "x")
	missing := filepath.Join(t.TempDir(), "gone")
	dir := filepath.Join(t.TempDir(), "ctr")
	_, err := c.Prepare(ctx, overlayMounts(t.TempDir(), t.TempDir(), good, missing), dir)
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("err = %v, want not found naming %s", err, missing)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("container dir holds %d entries", len(ents))
	}
	refs, _ := os.ReadDir(c.refsDir())
	for _, e := range refs {
		if rs, _ := os.ReadDir(filepath.Join(c.refsDir(), e.Name())); len(rs) != 0 {
			t.Errorf("reference left on %s", e.Name())
		}
	}

	_, err = c.Prepare(ctx, overlayMounts(t.TempDir(), t.TempDir(), good), dir, WithScratchSize(1<<20))
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("tiny scratch: %v", err)
	}
	if _, err := c.Prepare(ctx, overlayMounts(t.TempDir(), t.TempDir(), good), "relative/dir"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("relative dir: %v", err)
	}
	if err := c.Release(ctx, Rootfs{Dir: dir, Layers: []string{"/etc/passwd"}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("release of a foreign layer: %v", err)
	}
	if err := c.Release(ctx, Rootfs{Dir: dir, Scratch: "/etc/passwd"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("release of a foreign scratch: %v", err)
	}
}

// TestConcurrentPrepareBuildsOnce has many containers of one image start at
// once: each layer is built once. flock locks belong to open file
// descriptions, so goroutines exclude each other as shims do;
// TestConcurrentShims checks separate processes.
func TestConcurrentPrepareBuildsOnce(t *testing.T) {
	needTools(t)
	ctx, logs := countingContext(t)
	c := openCache(t)
	l1, l2 := t.TempDir(), t.TempDir()
	writeManyFiles(t, l1, 200, 4<<10)
	writeManyFiles(t, l2, 50, 1<<10)
	const n = 6
	var wg sync.WaitGroup
	results := make([]Rootfs, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.Prepare(ctx, []Mount{{Type: "overlay", Options: []string{"lowerdir=" + l2 + ":" + l1}}},
				filepath.Join(t.TempDir(), fmt.Sprint("ctr", i)))
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if strings.Join(results[i].Layers, ",") != strings.Join(results[0].Layers, ",") {
			t.Errorf("container %d got %q", i, results[i].Layers)
		}
	}
	if b := logs.count("layer image built"); b != 2 {
		t.Errorf("%d builds for 2 layers", b)
	}
}

// TestConcurrentShims runs Prepare of the same new layer in separate
// processes (this test binary, re-executed) at the same time.
func TestConcurrentShims(t *testing.T) {
	needTools(t)
	if dir := os.Getenv("COCOON_ROOTFS_HELPER_CACHE"); dir != "" {
		helperPrepare(t, dir)
		return
	}
	c := openCache(t)
	layer := t.TempDir()
	writeManyFiles(t, layer, 300, 8<<10)
	const n = 3
	outs := make([]bytes.Buffer, n)
	cmds := make([]*exec.Cmd, n)
	for i := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^TestConcurrentShims$", "-test.v")
		cmd.Env = append(os.Environ(),
			"COCOON_ROOTFS_HELPER_CACHE="+c.Dir(),
			"COCOON_ROOTFS_HELPER_LAYER="+layer,
			"COCOON_ROOTFS_HELPER_DIR="+filepath.Join(t.TempDir(), "ctr"))
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		cmds[i] = cmd
	}
	for _, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	built := 0
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v\n%s", i, err, outs[i].String())
		}
		built += strings.Count(outs[i].String(), "layer image built")
	}
	if built != 1 {
		t.Errorf("%d processes built the layer %d times", n, built)
	}
	if keys, _ := c.keys(); len(keys) != 1 {
		t.Errorf("cache holds %d images", len(keys))
	}
}

func helperPrepare(t *testing.T, cacheDir string) {
	c, err := Open(cacheDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, _ := countingContext(t)
	_, err = c.Prepare(ctx, []Mount{{Type: "bind", Source: os.Getenv("COCOON_ROOTFS_HELPER_LAYER"), Options: []string{"ro"}}},
		os.Getenv("COCOON_ROOTFS_HELPER_DIR"))
	if err != nil {
		t.Fatal(err)
	}
}

// writeManyFiles fills dir with n files of size bytes each, in
// subdirectories of 50.
func writeManyFiles(t *testing.T, dir string, n, size int) {
	t.Helper()
	buf := bytes.Repeat([]byte("cocoon layer data "), size/18+1)[:size]
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d%03d/f%05d", i/50, i))
		if i%50 == 0 {
			os.MkdirAll(filepath.Dir(p), 0o755)
		}
		buf[0] = byte(i)
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPrepareHonoursCancellation(t *testing.T) {
	needTools(t)
	c := openCache(t)
	layer := t.TempDir()
	writeManyFiles(t, layer, 100, 1<<10)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := filepath.Join(t.TempDir(), "ctr")
	if _, err := c.Prepare(ctx, []Mount{{Type: "bind", Source: layer}}, dir); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if keys, _ := c.keys(); len(keys) != 0 {
		t.Errorf("cancelled prepare cached %d images", len(keys))
	}

	// A Prepare waiting for GC's exclusive lock gives up with its ctx.
	lk, err := lockFile(context.Background(), c.lockPath(), unix.LOCK_EX)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock()
	tctx, tcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer tcancel()
	if _, err := c.Prepare(tctx, []Mount{{Type: "bind", Source: layer}}, dir); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
}

// A layer rebuilt after GC is byte for byte the image it was: a
// checkpoint's guest has the old one in its page cache.
func TestLayerRebuildIsReproducible(t *testing.T) {
	needTools(t)
	ctx := context.Background()
	c := openCache(t)
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "etc/hostname"), "layer")
	writeFile(t, filepath.Join(src, "bin/sh"), "#!")
	old := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	if err := os.Chtimes(filepath.Join(src, "etc/hostname"), old, old); err != nil {
		t.Fatal(err)
	}
	mounts := []Mount{{Type: "bind", Source: src, Options: []string{"ro"}}}
	dir := filepath.Join(t.TempDir(), "c")
	r, err := c.Prepare(ctx, mounts, dir)
	if err != nil {
		t.Fatal(err)
	}
	first, err := c.LayerDigest(r.Layers[0])
	if err != nil || !strings.HasPrefix(first, "sha256:") {
		t.Fatalf("digest %q, %v", first, err)
	}
	if err := c.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	if removed, _, err := c.GC(ctx, GCOptions{MinIdle: -1}); err != nil || removed != 1 {
		t.Fatalf("gc removed %d: %v", removed, err)
	}
	// Build time and UUID would differ a second later.
	time.Sleep(1100 * time.Millisecond)
	r, err = c.Prepare(ctx, mounts, dir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.LayerDigest(r.Layers[0])
	if err != nil || again != first {
		t.Fatalf("rebuilt digest %q (%v), first %q", again, err, first)
	}
	data, err := os.ReadFile(r.Layers[0])
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(data); "sha256:"+hex.EncodeToString(sum[:]) != first {
		t.Fatalf("recorded digest %s is not the image's", first)
	}
	if _, err := c.LayerDigest(filepath.Join(t.TempDir(), "x.erofs")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("digest of a foreign file: %v", err)
	}
}
