//go:build linux

package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/rootfs"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts are device nodes, opaque directories trusted xattrs")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// overlayUpper makes an upper directory as the guest's overlayfs leaves
// it: files, a whiteout, an opaque directory, hard links (a whiteout
// shares an inode with another, as overlayfs links them), a symlink, a
// FIFO, a socket, owners, modes, times and attributes of its own and
// overlayfs'.
func overlayUpper(t *testing.T) string {
	t.Helper()
	up := filepath.Join(t.TempDir(), "upper")
	must(t, os.MkdirAll(filepath.Join(up, "etc"), 0o755))
	must(t, unix.Chmod(up, 0o751))
	must(t, os.WriteFile(filepath.Join(up, "etc/hosts"), []byte("127.0.0.1 here\n"), 0o644))
	must(t, unix.Mknod(filepath.Join(up, "etc/passwd"), unix.S_IFCHR, 0))
	must(t, os.Link(filepath.Join(up, "etc/passwd"), filepath.Join(up, "etc/group")))
	must(t, os.MkdirAll(filepath.Join(up, "var/lib"), 0o700))
	must(t, unix.Lsetxattr(filepath.Join(up, "var/lib"), "trusted.overlay.opaque", []byte("y"), 0))
	must(t, unix.Lsetxattr(filepath.Join(up, "var"), "trusted.overlay.impure", []byte("y"), 0))
	must(t, os.WriteFile(filepath.Join(up, "var/lib/state"), []byte("state\n"), 0o600))
	must(t, os.Lchown(filepath.Join(up, "var/lib/state"), 1000, 1001))
	must(t, unix.Chmod(filepath.Join(up, "var/lib/state"), 0o4710))
	must(t, unix.Lsetxattr(filepath.Join(up, "var/lib/state"), "user.note", []byte("kept"), 0))
	must(t, unix.Lsetxattr(filepath.Join(up, "var/lib/state"), "trusted.overlay.origin", []byte("guest file handle"), 0))
	must(t, os.Link(filepath.Join(up, "var/lib/state"), filepath.Join(up, "var/state-link")))
	must(t, os.Symlink("../etc/hosts", filepath.Join(up, "var/hosts")))
	must(t, unix.Mkfifo(filepath.Join(up, "var/fifo"), 0o640))
	l, err := net.Listen("unix", filepath.Join(up, "var/sock"))
	must(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	when := []unix.Timespec{{Sec: 1700000000, Nsec: 5}, {Sec: 1700000000, Nsec: 987654321}}
	must(t, unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(up, "etc/hosts"), when, unix.AT_SYMLINK_NOFOLLOW))
	return up
}

// TestWriteLayerDiff: the tar of an overlayfs upper directory in the OCI
// layer format: the root first, OCI whiteouts, the opaque marker after
// its directory, hard links, PAX xattrs without overlayfs' own, no socket.
func TestWriteLayerDiff(t *testing.T) {
	needRoot(t)
	up := overlayUpper(t)
	var buf bytes.Buffer
	st, err := writeLayerDiff(context.Background(), &buf, up, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.bytes != uint64(buf.Len()) {
		t.Errorf("counted %d bytes, wrote %d", st.bytes, buf.Len())
	}
	var names []string
	hdrs := map[string]*tar.Header{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		must(t, err)
		names = append(names, h.Name)
		hdrs[h.Name] = h
	}
	want := []string{"./", "etc/", "etc/.wh.group", "etc/hosts", "etc/.wh.passwd", "var/", "var/fifo", "var/hosts", "var/lib/",
		"var/lib/.wh..wh..opq", "var/lib/state", "var/state-link"}
	if !reflect.DeepEqual(names, want) || st.entries != uint64(len(want)) {
		t.Fatalf("entries %q (%d counted), want %q", names, st.entries, want)
	}
	if h := hdrs["./"]; h.Mode != 0o751 || h.Typeflag != tar.TypeDir {
		t.Errorf("root: %+v", h)
	}
	if h := hdrs["etc/hosts"]; h.ModTime.UnixNano() != 1700000000987654321 {
		t.Errorf("etc/hosts mtime %v", h.ModTime)
	}
	s := hdrs["var/lib/state"]
	if s.Mode != 0o4710 || s.Uid != 1000 || s.Gid != 1001 || s.PAXRecords[paxXattr+"user.note"] != "kept" {
		t.Errorf("state: %+v", s)
	}
	for name, h := range hdrs {
		for k := range h.PAXRecords {
			if strings.HasPrefix(k, paxXattr+overlayXattr) {
				t.Errorf("%s carries %s", name, k)
			}
		}
	}
	if h := hdrs["var/state-link"]; h.Typeflag != tar.TypeLink || h.Linkname != "var/lib/state" {
		t.Errorf("link: %+v", h)
	}
	if h := hdrs["var/hosts"]; h.Typeflag != tar.TypeSymlink || h.Linkname != "../etc/hosts" {
		t.Errorf("symlink: %+v", h)
	}
}

// TestLayerDiffRoundTrip: what the guest writes, the host's copy back
// applies into an upperdir as the same tree, overlayfs' format and all.
func TestLayerDiffRoundTrip(t *testing.T) {
	needRoot(t)
	up := overlayUpper(t)
	must(t, os.Remove(filepath.Join(up, "var/sock"))) // not carried
	var buf bytes.Buffer
	if _, err := writeLayerDiff(context.Background(), &buf, up, 0); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(t.TempDir(), "fs")
	must(t, os.Mkdir(host, 0o755))
	c, err := rootfs.Open(filepath.Join(t.TempDir(), "cache"))
	must(t, err)
	dir := t.TempDir()
	r := rootfs.Rootfs{Dir: dir, Scratch: filepath.Join(dir, rootfs.ScratchFile), Upper: host}
	diff := &bufferDiff{r: &buf}
	rep, err := c.CopyBack(context.Background(), r, rootfs.PolicyFor(nil), func(context.Context, int64) (rootfs.LayerDiff, error) { return diff, nil })
	if err != nil {
		t.Fatal(err)
	}
	// The container ran as root without capabilities: the set-uid file
	// of user 1000 loses its bit (on both its names); nothing else is
	// refused.
	if rep.Denied() != 2 {
		t.Errorf("report %+v", rep)
	}
	must(t, unix.Chmod(filepath.Join(up, "var/lib/state"), 0o710))
	if got, want := listTree(t, host), listTree(t, up); !reflect.DeepEqual(got, want) {
		t.Errorf("host upperdir\n got %v\nwant %v", got, want)
	}
}

// bufferDiff is a LayerDiff over a buffer, whole and changed.
type bufferDiff struct{ r io.Reader }

func (d *bufferDiff) Read(p []byte) (int, error) { return d.r.Read(p) }
func (d *bufferDiff) Close() error               { return nil }
func (d *bufferDiff) Wait(context.Context) (bool, uint64, error) {
	return true, 0, nil
}

// listTree describes every entry below dir: type, mode, owner, size or
// device or target, mtime, and the attributes but overlayfs' origin and
// impure (which describe the guest's layers), with hard links as links.
func listTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	inodes := map[uint64]string{}
	must(t, filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		must(t, unix.Lstat(p, &st))
		desc := fmt.Sprintf("%o %d:%d size %d rdev %d", st.Mode, st.Uid, st.Gid, st.Size, st.Rdev)
		if st.Mode&unix.S_IFMT == unix.S_IFREG || st.Mode&unix.S_IFMT == unix.S_IFLNK {
			desc += fmt.Sprintf(" mtime %d.%09d", st.Mtim.Sec, st.Mtim.Nsec)
		}
		if first, ok := inodes[st.Ino]; ok && st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Mode&unix.S_IFMT != unix.S_IFCHR {
			desc += " link of " + first
		}
		inodes[st.Ino] = rel
		names, err := listXattrs(p)
		must(t, err)
		for _, n := range names {
			if n == "trusted.overlay.origin" || n == "trusted.overlay.impure" {
				continue
			}
			v, _ := getXattr(p, n)
			desc += fmt.Sprintf(" %s=%q", n, v)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			target, _ := os.Readlink(p)
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	}))
	return out
}

// TestWriteLayerDiffBound: past its bound the diff fails, naming it.
func TestWriteLayerDiffBound(t *testing.T) {
	up := t.TempDir()
	must(t, os.WriteFile(filepath.Join(up, "big"), make([]byte, 1<<20), 0o644))
	_, err := writeLayerDiff(context.Background(), io.Discard, up, 64<<10)
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("err = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := writeLayerDiff(ctx, io.Discard, up, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
