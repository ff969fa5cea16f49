package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestApplyUpper replays an overlayfs upper directory onto a directory:
// the result is the merged view overlayfs would show.
func TestApplyUpper(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	upper, dst := filepath.Join(root, "upper"), filepath.Join(root, "dst")

	// The directory as the container found it.
	writeFile(t, filepath.Join(dst, "kept"), "untouched\n")
	writeFile(t, filepath.Join(dst, "deleted"), "whited out\n")
	writeFile(t, filepath.Join(dst, "replaced"), "old content\n")
	writeFile(t, filepath.Join(dst, "opaque/old"), "gone with the opaque dir\n")
	writeFile(t, filepath.Join(dst, "dir-now-file/x"), "a directory replaced by a file\n")
	writeFile(t, filepath.Join(dst, "merged/old"), "stays: the dir is not opaque\n")

	// What the container did, as overlayfs records it.
	must(t, os.MkdirAll(upper, 0o755))
	must(t, unix.Chmod(upper, 0o750))
	must(t, unix.Mknod(filepath.Join(upper, "deleted"), unix.S_IFCHR, 0))
	writeFile(t, filepath.Join(upper, "replaced"), "new content\n")
	must(t, os.MkdirAll(filepath.Join(upper, "opaque"), 0o755))
	must(t, unix.Lsetxattr(filepath.Join(upper, "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	writeFile(t, filepath.Join(upper, "opaque/new"), "in the opaque dir\n")
	writeFile(t, filepath.Join(upper, "dir-now-file"), "now a file\n")
	writeFile(t, filepath.Join(upper, "merged/new"), "added\n")
	owned := filepath.Join(upper, "deep/er/owned")
	writeFile(t, owned, "owned\n")
	must(t, os.Lchown(owned, 1234, 5678))
	must(t, unix.Chmod(owned, 0o4750))
	must(t, unix.Lsetxattr(owned, "user.cocoon", []byte("kept"), 0))
	must(t, os.Link(owned, filepath.Join(upper, "deep/link")))
	must(t, os.Symlink("er/owned", filepath.Join(upper, "deep/sym")))
	must(t, unix.Mkfifo(filepath.Join(upper, "fifo"), 0o600))
	must(t, unix.Utimes(filepath.Join(upper, "replaced"), []unix.Timeval{{Sec: 981173106}, {Sec: 981173106}}))

	if err := applyUpper(context.Background(), upper, dst); err != nil {
		t.Fatal(err)
	}

	for p, want := range map[string]string{
		"kept": "untouched\n", "replaced": "new content\n", "opaque/new": "in the opaque dir\n",
		"dir-now-file": "now a file\n", "merged/old": "stays: the dir is not opaque\n", "merged/new": "added\n",
		"deep/er/owned": "owned\n", "deep/link": "owned\n",
	} {
		if got, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", p, got, err, want)
		}
	}
	for _, gone := range []string{"deleted", "opaque/old"} {
		if _, err := os.Lstat(filepath.Join(dst, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there: %v", gone, err)
		}
	}
	var st, st2 unix.Stat_t
	must(t, unix.Lstat(filepath.Join(dst, "deep/er/owned"), &st))
	if st.Uid != 1234 || st.Gid != 5678 || st.Mode&0o7777 != 0o4750 || st.Nlink != 2 {
		t.Errorf("owned: uid %d gid %d mode %o nlink %d", st.Uid, st.Gid, st.Mode&0o7777, st.Nlink)
	}
	must(t, unix.Lstat(filepath.Join(dst, "deep/link"), &st2))
	if st.Ino != st2.Ino {
		t.Error("the hard link became a copy")
	}
	buf := make([]byte, 16)
	if n, err := unix.Lgetxattr(filepath.Join(dst, "deep/er/owned"), "user.cocoon", buf); err != nil || string(buf[:n]) != "kept" {
		t.Errorf("xattr = %q, %v", buf[:max(n, 0)], err)
	}
	if _, err := unix.Lgetxattr(filepath.Join(dst, "opaque"), "trusted.overlay.opaque", buf); err == nil {
		t.Error("overlayfs' opaque mark was carried onto the plain directory")
	}
	if l, err := os.Readlink(filepath.Join(dst, "deep/sym")); err != nil || l != "er/owned" {
		t.Errorf("symlink = %q, %v", l, err)
	}
	must(t, unix.Lstat(filepath.Join(dst, "fifo"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("fifo mode %o", st.Mode)
	}
	must(t, unix.Lstat(filepath.Join(dst, "replaced"), &st))
	if st.Mtim.Sec != 981173106 {
		t.Errorf("mtime %d, want 981173106", st.Mtim.Sec)
	}
	must(t, unix.Lstat(dst, &st))
	if st.Mode&0o7777 != 0o750 {
		t.Errorf("root mode %o, want the upper root's 0750", st.Mode&0o7777)
	}
}
