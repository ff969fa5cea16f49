package rootfs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mountForTest mounts with mount(8) (which sets up and auto-clears loop
// devices) and unmounts in t.Cleanup.
func mountForTest(t *testing.T, fstype, opts, src, target string) {
	t.Helper()
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("mount", "-t", fstype, "-o", opts, src, target).CombinedOutput()
	if err != nil {
		t.Skipf("cannot mount %s %s here: %v: %s", fstype, src, err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(target, 0); err != nil {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
}

// TestAssembledOverlay builds the layers of a two-layer image and a
// container's pre-populated upperdir, then assembles them on the host as
// the agent does in the guest: EROFS layers and the ext4 scratch on loop
// devices, overlayfs over them. What overlayfs relies on (whiteouts, opaque
// directories) and what containers rely on (owners, modes, set-id bits,
// xattrs, hard links, special files, mtimes) must come through.
func TestAssembledOverlay(t *testing.T) {
	needTools(t)
	needRoot(t)
	ctx := context.Background()
	root := t.TempDir()
	base, app, upper := filepath.Join(root, "1/fs"), filepath.Join(root, "2/fs"), filepath.Join(root, "3/fs")

	// Layer 1, the base.
	writeFile(t, filepath.Join(base, "etc/hostname"), "base\n")
	writeFile(t, filepath.Join(base, "hidden"), "whited out by layer 2\n")
	writeFile(t, filepath.Join(base, "opaque/old"), "hidden by an opaque dir\n")
	writeFile(t, filepath.Join(base, "gone"), "deleted by the container before it ran\n")
	suid := filepath.Join(base, "usr/bin/suid")
	writeFile(t, suid, "#!/bin/true\n")
	must(t, os.Lchown(suid, 1234, 5678))
	must(t, unix.Chmod(suid, 0o4750))
	must(t, unix.Lsetxattr(suid, "user.cocoon", []byte("kept"), 0))
	must(t, unix.Lsetxattr(suid, "security.capability", []byte{1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0))
	must(t, os.Link(suid, filepath.Join(base, "usr/bin/hardlink")))
	must(t, os.Symlink("bin/suid", filepath.Join(base, "usr/link")))
	must(t, unix.Mkfifo(filepath.Join(base, "fifo"), 0o600))
	must(t, unix.Mknod(filepath.Join(base, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	old := filepath.Join(base, "etc/hostname")
	must(t, unix.Utimes(old, []unix.Timeval{{Sec: 981173106}, {Sec: 981173106}}))

	// Layer 2: a whiteout, an opaque directory, a file.
	must(t, os.MkdirAll(filepath.Join(app, "opaque"), 0o755))
	must(t, unix.Mknod(filepath.Join(app, "hidden"), unix.S_IFCHR, 0))
	must(t, unix.Lsetxattr(filepath.Join(app, "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	writeFile(t, filepath.Join(app, "opaque/new"), "layer 2\n")
	writeFile(t, filepath.Join(app, "app"), "layer 2 app\n")

	// The container's upperdir, already holding a file and a whiteout.
	writeFile(t, filepath.Join(upper, "from-upper"), "written before start\n")
	must(t, unix.Mknod(filepath.Join(upper, "gone"), unix.S_IFCHR, 0))

	c := openCache(t)
	dir := filepath.Join(t.TempDir(), "ctr")
	r, err := c.Prepare(ctx, overlayMounts(upper, filepath.Join(root, "3/work"), base, app), dir, WithScratchSize(256<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Release(ctx, r) })

	mnt := t.TempDir()
	var lowers []string
	for i, img := range r.Layers {
		m := filepath.Join(mnt, "layer", string(rune('0'+i)))
		mountForTest(t, LayerFSType, "loop,ro", img, m)
		lowers = append([]string{m}, lowers...) // top-most first
	}
	scratch := filepath.Join(mnt, "scratch")
	mountForTest(t, ScratchFSType, "loop", r.Scratch, scratch)
	merged := filepath.Join(mnt, "merged")
	must(t, os.MkdirAll(merged, 0o755))
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + filepath.Join(scratch, ScratchUpperDir) + ",workdir=" + filepath.Join(scratch, ScratchWorkDir)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("overlay mount: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(merged, 0); err != nil {
			t.Errorf("unmount overlay: %v", err)
		}
	})

	for _, gone := range []string{"hidden", "opaque/old", "gone"} {
		if _, err := os.Lstat(filepath.Join(merged, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s visible in the merged root: %v", gone, err)
		}
	}
	for p, want := range map[string]string{
		"etc/hostname": "base\n", "opaque/new": "layer 2\n", "app": "layer 2 app\n", "from-upper": "written before start\n",
	} {
		if got, err := os.ReadFile(filepath.Join(merged, p)); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", p, got, err, want)
		}
	}
	var st, st2 unix.Stat_t
	must(t, unix.Lstat(filepath.Join(merged, "usr/bin/suid"), &st))
	if st.Uid != 1234 || st.Gid != 5678 || st.Mode&0o7777 != 0o4750 || st.Nlink != 2 {
		t.Errorf("suid file: uid %d gid %d mode %o nlink %d", st.Uid, st.Gid, st.Mode&0o7777, st.Nlink)
	}
	must(t, unix.Lstat(filepath.Join(merged, "usr/bin/hardlink"), &st2))
	if st.Ino != st2.Ino {
		t.Errorf("hard link lost: inodes %d and %d", st.Ino, st2.Ino)
	}
	for name, want := range map[string]string{"user.cocoon": "kept", "security.capability": "\x01\x00\x00\x02"} {
		buf := make([]byte, 64)
		n, err := unix.Lgetxattr(filepath.Join(merged, "usr/bin/suid"), name, buf)
		if err != nil || !strings.HasPrefix(string(buf[:n]), want) {
			t.Errorf("xattr %s = %q, %v", name, buf[:max(n, 0)], err)
		}
	}
	if l, err := os.Readlink(filepath.Join(merged, "usr/link")); err != nil || l != "bin/suid" {
		t.Errorf("symlink = %q, %v", l, err)
	}
	must(t, unix.Lstat(filepath.Join(merged, "fifo"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("fifo mode %o", st.Mode)
	}
	must(t, unix.Lstat(filepath.Join(merged, "null"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(1, 3) {
		t.Errorf("device node: mode %o rdev %x", st.Mode, st.Rdev)
	}
	must(t, unix.Lstat(filepath.Join(merged, "etc/hostname"), &st))
	if st.Mtim.Sec != 981173106 {
		t.Errorf("mtime %d, want 981173106", st.Mtim.Sec)
	}

	// Writes land on the scratch disk, deletions become whiteouts there.
	must(t, os.WriteFile(filepath.Join(merged, "written"), []byte("w"), 0o644))
	must(t, os.Remove(filepath.Join(merged, "app")))
	if _, err := os.Stat(filepath.Join(scratch, ScratchUpperDir, "written")); err != nil {
		t.Errorf("write not on the scratch disk: %v", err)
	}
	must(t, unix.Lstat(filepath.Join(scratch, ScratchUpperDir, "app"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("deletion left mode %o rdev %d on the scratch, want a whiteout", st.Mode, st.Rdev)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
