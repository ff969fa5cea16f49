package rootfs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyBack writes to a container's scratch disk as the guest's
// overlay would (a new file, a whiteout for a lower file, an opaque
// directory, a file removed from the old upper) and copies the layer back:
// the host upperdir then holds exactly the disk's upper/.
func TestCopyBack(t *testing.T) {
	needTools(t)
	needRoot(t)
	ctx := context.Background()
	root := t.TempDir()
	base, upper := filepath.Join(root, "1/fs"), filepath.Join(root, "2/fs")
	writeFile(t, filepath.Join(base, "etc/os-release"), "base\n")
	writeFile(t, filepath.Join(base, "data/old"), "lower\n")
	writeFile(t, filepath.Join(upper, "kept"), "written by an earlier run\n")
	writeFile(t, filepath.Join(upper, "dropped"), "removed by this run\n")

	c := openCache(t)
	dir := filepath.Join(t.TempDir(), "ctr")
	r, err := c.Prepare(ctx, overlayMounts(upper, filepath.Join(root, "2/work"), base), dir, WithScratchSize(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Release(ctx, r) })
	if r.Upper != upper {
		t.Fatalf("Rootfs.Upper = %q, want %q", r.Upper, upper)
	}

	// The run, as overlayfs records it in the scratch disk's upper/.
	scratch := t.TempDir()
	if out, err := exec.Command("mount", "-t", ScratchFSType, "-o", "loop", r.Scratch, scratch).CombinedOutput(); err != nil {
		t.Skipf("cannot loop-mount the scratch disk here: %v: %s", err, out)
	}
	up := filepath.Join(scratch, ScratchUpperDir)
	writeFile(t, filepath.Join(up, "new/file"), "written by this run\n")
	must(t, unix.Lsetxattr(filepath.Join(up, "new/file"), "user.cocoon", []byte("x"), 0))
	must(t, unix.Mknod(filepath.Join(up, "etc-gone"), unix.S_IFCHR, 0))
	must(t, os.MkdirAll(filepath.Join(up, "data"), 0o755))
	must(t, unix.Lsetxattr(filepath.Join(up, "data"), "trusted.overlay.opaque", []byte("y"), 0))
	must(t, os.Remove(filepath.Join(up, "dropped")))
	must(t, unix.Unmount(scratch, 0))

	if err := c.CopyBack(ctx, r); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"kept": "written by an earlier run\n", "new/file": "written by this run\n"} {
		if got, err := os.ReadFile(filepath.Join(upper, p)); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", p, got, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(upper, "dropped")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dropped still in the upperdir: %v", err)
	}
	var st unix.Stat_t
	must(t, unix.Lstat(filepath.Join(upper, "etc-gone"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout came back as mode %o rdev %d", st.Mode, st.Rdev)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(upper, "data"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque xattr = %q, %v", buf[:max(n, 0)], err)
	}
	if n, err := unix.Lgetxattr(filepath.Join(upper, "new/file"), "user.cocoon", buf); err != nil || string(buf[:n]) != "x" {
		t.Errorf("user xattr = %q, %v", buf[:max(n, 0)], err)
	}
	for _, left := range []string{upper + copyBackNew, upper + copyBackOld} {
		if _, err := os.Lstat(left); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", left, err)
		}
	}
	// Nothing stays mounted in the container directory.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			t.Errorf("%s left in the container directory", e.Name())
		}
	}

	// A root without an upperdir has nothing to copy back.
	if err := c.CopyBack(ctx, Rootfs{Dir: dir, Scratch: r.Scratch}); err != nil {
		t.Errorf("no upperdir: %v", err)
	}
}
