package rootfs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustFingerprint(t *testing.T, dir string) snapshot {
	t.Helper()
	s, err := fingerprint(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestFingerprintSeesChanges(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "etc/os-release"), "ID=test\n")
	writeFile(t, filepath.Join(dir, "bin/sh"), "#!binary")
	base := mustFingerprint(t, dir)
	if again := mustFingerprint(t, dir); again.sum != base.sum {
		t.Fatal("two walks of an unchanged tree differ")
	}
	if base.entries != 5 || base.bytes != int64(len("ID=test\n")+len("#!binary")) {
		t.Errorf("entries %d bytes %d", base.entries, base.bytes)
	}

	// Same size, mtime put back: only the ctime tells.
	p := filepath.Join(dir, "etc/os-release")
	fi, _ := os.Stat(p)
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(p, []byte("ID=evil\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	changed := mustFingerprint(t, dir)
	if changed.sum == base.sum {
		t.Fatal("same-size rewrite with the mtime put back went unnoticed")
	}

	for _, tc := range []struct {
		name   string
		change func() error
	}{
		{"chmod", func() error { return os.Chmod(filepath.Join(dir, "bin/sh"), 0o755) }},
		{"add", func() error { return os.WriteFile(filepath.Join(dir, "new"), nil, 0o644) }},
		{"rename", func() error { return os.Rename(filepath.Join(dir, "new"), filepath.Join(dir, "new2")) }},
		{"mkdir", func() error { return os.Mkdir(filepath.Join(dir, "bin/sub"), 0o755) }},
		{"remove", func() error { return os.Remove(filepath.Join(dir, "bin/sub")) }},
	} {
		before := mustFingerprint(t, dir)
		if err := tc.change(); err != nil {
			t.Fatal(err)
		}
		if after := mustFingerprint(t, dir); after.sum == before.sum {
			t.Errorf("%s went unnoticed", tc.name)
		}
	}
}

func TestFingerprintOfACopyDiffers(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	writeFile(t, filepath.Join(a, "f"), "x")
	b := filepath.Join(dir, "b")
	if out, err := exec.Command("cp", "-a", a, b).CombinedOutput(); err != nil {
		t.Skipf("cp -a: %v %s", err, out)
	}
	// Same names, sizes and mtimes but other inodes: another tree.
	if mustFingerprint(t, a).sum == mustFingerprint(t, b).sum {
		t.Fatal("a copy hashes like the original")
	}
}

func TestFingerprintErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := fingerprint(context.Background(), filepath.Join(dir, "missing"))
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing dir: %v", err)
	}
	writeFile(t, filepath.Join(dir, "file"), "x")
	if _, err := fingerprint(context.Background(), filepath.Join(dir, "file")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("file: %v", err)
	}
	os.Symlink(dir, filepath.Join(dir, "link"))
	if _, err := fingerprint(context.Background(), filepath.Join(dir, "link")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("symlink: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := fingerprint(ctx, dir); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

func TestFingerprintDepthLimit(t *testing.T) {
	dir := t.TempDir()
	deep := dir
	for range maxLayerDepth + 1 {
		deep = filepath.Join(deep, "d")
	}
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Skipf("cannot nest %d directories here: %v", maxLayerDepth+1, err)
	}
	_, err := fingerprint(context.Background(), dir)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "deeper") {
		t.Fatalf("err = %v", err)
	}
}

// TestMeasureFingerprint reports how long the walk takes on a large tree
// of the host, for docs/rootfs.md.
func TestMeasureFingerprint(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	for _, dir := range []string{"/usr/lib", "/usr/share"} {
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		mustFingerprint(t, dir) // warm the dentry cache, as a cached layer is
		start := time.Now()
		s := mustFingerprint(t, dir)
		t.Logf("fingerprint of %s: %d entries, %d MiB in %v", dir, s.entries, s.bytes>>20, time.Since(start).Round(time.Millisecond))
	}
}
