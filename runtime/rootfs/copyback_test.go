package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// allowAll is the policy of a container with every capability and no
// user namespace (ctr run --privileged).
var allowAll = Policy{Mknod: true, SetFcap: true, AnySetuid: true, AnySetgid: true, HasUID: true}

// TestCopyBack applies a layer diff as the guest sends it for an upperdir:
// the upperdir then holds what the diff holds, in overlayfs' format
// (whiteouts as character devices 0/0, opaque directories), with owners,
// modes, attributes, links and times; what the earlier upperdir held and
// the diff does not is gone, and the old upperdir is swapped out whole.
func TestCopyBack(t *testing.T) {
	needRoot(t)
	s := newSnapshot(t)
	writeFile(t, filepath.Join(s.lowers[0], "etc/os-release"), "base\n")
	writeFile(t, filepath.Join(s.lowers[0], "data/old"), "lower\n")
	writeFile(t, filepath.Join(s.upper, "kept"), "written by an earlier run\n")
	writeFile(t, filepath.Join(s.upper, "dropped"), "removed by this run\n")
	mtime := time.Unix(1700000000, 123456789)
	diff := tarOf(t,
		entry{name: "./", typ: tar.TypeDir, mode: 0o750, uid: 7, gid: 8},
		entry{name: "data/", typ: tar.TypeDir},
		entry{name: "data/.wh..wh..opq"},
		entry{name: "data/fresh", content: "in the opaque dir\n"},
		entry{name: "etc/", typ: tar.TypeDir},
		entry{name: "etc/.wh.os-release", uid: 5, mode: 0o600},
		entry{name: "fifo", typ: tar.TypeFifo, mode: 0o600},
		entry{name: "kept", content: "written by an earlier run\n"},
		entry{name: "link", typ: tar.TypeSymlink, link: "/etc/passwd"},
		entry{name: "new/", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1000},
		entry{name: "new/file", content: "written by this run\n", mode: 0o4750, uid: 1000, gid: 1000, mtime: mtime,
			xattrs: map[string]string{"user.cocoon": "x", "security.capability": fcaps(13), "trusted.overlay.origin": "guest's"}},
		// A link's header carries its inode's attributes, as the guest
		// writes it.
		entry{name: "new/hard", typ: tar.TypeLink, link: "new/file", mode: 0o4750, uid: 1000, gid: 1000, mtime: mtime,
			xattrs: map[string]string{"user.cocoon": "x", "security.capability": fcaps(13)}},
	)
	c := openCache(t)
	var asked int64
	d := changedDiff(diff)
	rep, err := c.CopyBack(context.Background(), s.rootfs(t), allowAll, exportOf(d, &asked))
	if err != nil {
		t.Fatal(err)
	}
	if asked != DefaultCopyBackMaxBytes || !d.closed {
		t.Errorf("asked for %d bytes (want %d), closed %v", asked, DefaultCopyBackMaxBytes, d.closed)
	}
	want := map[string]string{
		".":              "d 750 7:8 ",
		"data":           "d 755 0:0 ",
		"data/fresh":     "f 644 0:0 in the opaque dir\n",
		"etc":            "d 755 0:0 ",
		"etc/os-release": "c 0 0:0 0:0",
		"fifo":           "p 600 0:0 ",
		"kept":           "f 644 0:0 written by an earlier run\n",
		"link":           "l 777 0:0 /etc/passwd",
		"new":            "d 700 1000:1000 ",
		"new/file":       "f 4750 1000:1000 written by this run\n",
		"new/hard":       "f 4750 1000:1000 written by this run\n",
	}
	if got := tree(t, s.upper); !reflect.DeepEqual(got, want) {
		t.Errorf("upperdir:\n got %v\nwant %v", got, want)
	}
	if v := xattr(filepath.Join(s.upper, "data"), "trusted.overlay.opaque"); v != "y" {
		t.Errorf("data is not opaque: %q", v)
	}
	file := filepath.Join(s.upper, "new/file")
	if xattr(file, "user.cocoon") != "x" || xattr(file, "security.capability") != fcaps(13) || xattr(file, "trusted.overlay.origin") != "" {
		t.Errorf("xattrs of new/file: user %q, caps %q, origin %q", xattr(file, "user.cocoon"), xattr(file, "security.capability"), xattr(file, "trusted.overlay.origin"))
	}
	var a, b unix.Stat_t
	must(t, unix.Lstat(file, &a))
	must(t, unix.Lstat(filepath.Join(s.upper, "new/hard"), &b))
	if a.Ino != b.Ino {
		t.Error("new/hard is not a hard link of new/file")
	}
	if a.Mtim.Sec != mtime.Unix() || a.Mtim.Nsec != int64(mtime.Nanosecond()) {
		t.Errorf("mtime %v, want %v", time.Unix(a.Mtim.Sec, a.Mtim.Nsec), mtime)
	}
	// overlayfs' own attribute is refused, and said so.
	if !rep.Changed || rep.Bytes != int64(len(diff)) || rep.Stripped[strippedTrusted] != 1 || rep.Denied() != 1 {
		t.Errorf("report %+v", rep)
	}
	s.checkOutside(t)
}

// TestCopyBackDirRoot applies a diff onto a writable directory root:
// whiteouts delete, opaque directories replace, the rest is written over;
// the directory then holds what the container saw.
func TestCopyBackDirRoot(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	dst := filepath.Join(root, "dir")
	writeFile(t, filepath.Join(dst, "kept"), "untouched\n")
	writeFile(t, filepath.Join(dst, "deleted"), "whited out\n")
	writeFile(t, filepath.Join(dst, "replaced"), "old content\n")
	writeFile(t, filepath.Join(dst, "opaque/old"), "gone with the opaque dir\n")
	writeFile(t, filepath.Join(dst, "merged/old"), "stays: the dir is not opaque\n")
	writeFile(t, filepath.Join(dst, "dir-now-file/x"), "a directory replaced by a file\n")
	diff := tarOf(t,
		entry{name: "./", typ: tar.TypeDir, mode: 0o711},
		entry{name: ".wh.deleted"},
		entry{name: "dir-now-file", content: "now a file\n"},
		entry{name: "merged/", typ: tar.TypeDir},
		entry{name: "merged/new", content: "added\n"},
		entry{name: "opaque/", typ: tar.TypeDir},
		entry{name: "opaque/.wh..wh..opq"},
		entry{name: "opaque/new", content: "in the opaque dir\n"},
		entry{name: "replaced", content: "new content\n"},
	)
	c := openCache(t)
	dir := t.TempDir()
	r := Rootfs{Dir: dir, Scratch: filepath.Join(dir, ScratchFile), Bind: dst, Lowers: []string{dst}}
	if _, err := c.CopyBack(context.Background(), r, allowAll, exportOf(changedDiff(diff), nil)); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		".":            "d 711 0:0 ",
		"dir-now-file": "f 644 0:0 now a file\n",
		"kept":         "f 644 0:0 untouched\n",
		"merged":       "d 755 0:0 ",
		"merged/new":   "f 644 0:0 added\n",
		"merged/old":   "f 644 0:0 stays: the dir is not opaque\n",
		"opaque":       "d 755 0:0 ",
		"opaque/new":   "f 644 0:0 in the opaque dir\n",
		"replaced":     "f 644 0:0 new content\n",
	}
	if got := tree(t, dst); !reflect.DeepEqual(got, want) {
		t.Errorf("directory:\n got %v\nwant %v", got, want)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".diff-*")); len(left) != 0 {
		t.Errorf("spooled diff left: %v", left)
	}
}

// TestCopyBackHostile is the unit-level half of fault case 8: a diff a
// modified agent forged, with names that leave the target, writes through
// a symlink of its own, hard links out, device nodes a container without
// CAP_MKNOD cannot make and malformed whiteouts. What the policy allows is
// applied, the rest is refused and counted, and nothing outside the
// snapshot changes.
func TestCopyBackHostile(t *testing.T) {
	needRoot(t)
	s := newSnapshot(t)
	rel, err := filepath.Rel(s.upper, s.outside)
	must(t, err)
	diff := tarOf(t,
		entry{name: "./", typ: tar.TypeDir},
		entry{name: "../../../etc/escaped", content: "x"},
		entry{name: rel + "/escaped", content: "x"},
		entry{name: filepath.Join(s.outside, "absolute"), content: "x"},
		entry{name: "a/../../escaped", content: "x"},
		entry{name: "hostetc", typ: tar.TypeSymlink, link: s.outside},
		entry{name: "hostetc/passwd", content: "pwned\n"},
		entry{name: "hostetc/new", content: "pwned\n"},
		entry{name: "relsym", typ: tar.TypeSymlink, link: "../../../etc"},
		entry{name: "relsym/passwd", content: "pwned\n"},
		entry{name: "file", content: "a file\n"},
		entry{name: "file/child", content: "under a file\n"},
		entry{name: "hl-out", typ: tar.TypeLink, link: "../../../etc/passwd"},
		entry{name: "hl-abs", typ: tar.TypeLink, link: filepath.Join(s.outside, "passwd")},
		entry{name: "hl-none", typ: tar.TypeLink, link: "not-in-the-diff"},
		entry{name: "hl-ok", typ: tar.TypeLink, link: "file", mode: 0o644},
		entry{name: "sda", typ: tar.TypeBlock, mode: 0o666, major: 8, minor: 0},
		entry{name: "mem", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 1},
		entry{name: ".wh..", content: ""},
		entry{name: ".wh..wh.plnk"},
		entry{name: ".wh..wh..opq"},
		entry{name: "ok", content: "allowed\n"},
	)
	c := openCache(t)
	// A container without CAP_MKNOD (or any capability), no user
	// namespace.
	rep, err := c.CopyBack(context.Background(), s.rootfs(t), Policy{HasUID: true}, exportOf(changedDiff(diff), nil))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		".":       "d 755 0:0 ",
		"file":    "f 644 0:0 a file\n",
		"hl-ok":   "f 644 0:0 a file\n",
		"hostetc": "l 777 0:0 " + s.outside,
		"relsym":  "l 777 0:0 ../../../etc",
		"ok":      "f 644 0:0 allowed\n",
	}
	if got := tree(t, s.upper); !reflect.DeepEqual(got, want) {
		t.Errorf("upperdir:\n got %v\nwant %v", got, want)
	}
	s.checkOutside(t)
	wantRefused := map[string]int{
		refusedName:     6, // the four names, and the targets of hl-out and hl-abs
		refusedSymlink:  3,
		refusedNotDir:   1,
		refusedLink:     1,
		refusedDevice:   2,
		refusedWhiteout: 2,
		refusedOpaque:   1,
	}
	if !reflect.DeepEqual(rep.Refused, wantRefused) {
		t.Errorf("refused %v, want %v", rep.Refused, wantRefused)
	}
	if len(rep.Examples) != maxExamples || !strings.Contains(strings.Join(rep.Examples, "\n"), refusedName) {
		t.Errorf("examples %q", rep.Examples)
	}
}

// TestCopyBackDirRootSymlinkOut: a writable directory root that holds a
// symlink out of it, and a diff that writes below that name: the write
// lands inside the directory, as the container saw it, never outside.
func TestCopyBackDirRootSymlinkOut(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	dst, outside := filepath.Join(root, "dir"), filepath.Join(root, "etc")
	must(t, os.MkdirAll(dst, 0o755))
	must(t, os.MkdirAll(outside, 0o755))
	must(t, os.Symlink(outside, filepath.Join(dst, "out")))
	diff := tarOf(t, entry{name: "./", typ: tar.TypeDir}, entry{name: "out/pwned", content: "x"})
	dir := t.TempDir()
	r := Rootfs{Dir: dir, Scratch: filepath.Join(dir, ScratchFile), Bind: dst, Lowers: []string{dst}}
	if _, err := openCache(t).CopyBack(context.Background(), r, allowAll, exportOf(changedDiff(diff), nil)); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("written outside the root: %v", entries)
	}
}

// TestCopyBackPriorKept: an entry the policy would refuse is kept when the
// same path held the same before the container ran (a copy-up of the
// image's, or the earlier upperdir's): device nodes, owners outside the
// mapping, set-id bits, file capabilities. A new one is refused.
func TestCopyBackPriorKept(t *testing.T) {
	needRoot(t)
	s := newSnapshot(t)
	lower := s.lowers[0]
	must(t, os.MkdirAll(filepath.Join(lower, "dev"), 0o755))
	must(t, unix.Mknod(filepath.Join(lower, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	writeFile(t, filepath.Join(lower, "usr/bin/ping"), "ping\n")
	must(t, unix.Lsetxattr(filepath.Join(lower, "usr/bin/ping"), "security.capability", []byte(fcaps(13)), 0))
	writeFile(t, filepath.Join(lower, "usr/bin/su"), "su\n")
	must(t, unix.Chmod(filepath.Join(lower, "usr/bin/su"), 0o4755))
	writeFile(t, filepath.Join(s.upper, "owned-by-root"), "from the image\n")
	// A node the upperdir held, which the container linked to a new name
	// that sorts first: the guest sends the new name whole, the old one
	// as a link to it.
	must(t, unix.Mknod(filepath.Join(s.upper, "seeded"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	// A whiteout in the upperdir hides the lower's node: not a prior one.
	must(t, unix.Mknod(filepath.Join(s.upper, "gone"), unix.S_IFCHR, 0))
	must(t, unix.Mknod(filepath.Join(lower, "gone"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	diff := tarOf(t,
		entry{name: "./", typ: tar.TypeDir, uid: 100000, gid: 100000},
		entry{name: "dev/", typ: tar.TypeDir, uid: 100000, gid: 100000},
		entry{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
		entry{name: "dev/null2", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3, uid: 100000, gid: 100000},
		entry{name: "dev/zero", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 5},
		entry{name: "gone", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
		entry{name: "linked", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
		entry{name: "owned-by-root", content: "touched\n"},
		entry{name: "owned-by-host-user", content: "x", uid: 1000, gid: 1000},
		entry{name: "seeded", typ: tar.TypeLink, link: "linked", mode: 0o666},
		entry{name: "usr/", typ: tar.TypeDir, uid: 100000, gid: 100000},
		entry{name: "usr/bin/", typ: tar.TypeDir, uid: 100000, gid: 100000},
		entry{name: "usr/bin/ping", content: "ping\n", mode: 0o755, xattrs: map[string]string{"security.capability": fcaps(13)}},
		entry{name: "usr/bin/pong", content: "pong\n", mode: 0o755, uid: 100000, gid: 100000, xattrs: map[string]string{"security.capability": fcaps(13)}},
		entry{name: "usr/bin/su", content: "su\n", mode: 0o4755},
		entry{name: "usr/bin/sudo", content: "sudo\n", mode: 0o4755, uid: 100000, gid: 100000},
		entry{name: "usr/bin/ws", content: "x", mode: 0o2755, uid: 100000, gid: 100007},
	)
	// A container with a user namespace mapping 0-65535 to host
	// 100000-165535, running as its root, without capabilities.
	p := Policy{UserNS: true, UIDMap: []IDRange{{100000, 65536}}, GIDMap: []IDRange{{100000, 65536}}, UID: 100000, HasUID: true, GIDs: []uint32{100000}}
	rep, err := openCache(t).CopyBack(context.Background(), s.rootfs(t), p, exportOf(changedDiff(diff), nil))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		".":             "d 755 100000:100000 ",
		"dev":           "d 755 100000:100000 ",
		"dev/null":      "c 666 0:0 1:3",
		"owned-by-root": "f 644 0:0 touched\n",
		"seeded":        "c 666 0:0 1:3",
		"usr":           "d 755 100000:100000 ",
		"usr/bin":       "d 755 100000:100000 ",
		"usr/bin/ping":  "f 755 0:0 ping\n",
		"usr/bin/pong":  "f 755 100000:100000 pong\n",
		"usr/bin/su":    "f 4755 0:0 su\n",
		"usr/bin/sudo":  "f 4755 100000:100000 sudo\n",
		"usr/bin/ws":    "f 755 100000:100007 x",
	}
	if got := tree(t, s.upper); !reflect.DeepEqual(got, want) {
		t.Errorf("upperdir:\n got %v\nwant %v", got, want)
	}
	if v := xattr(filepath.Join(s.upper, "usr/bin/ping"), "security.capability"); v != fcaps(13) {
		t.Errorf("ping's capability: %q", v)
	}
	if v := xattr(filepath.Join(s.upper, "usr/bin/pong"), "security.capability"); v != "" {
		t.Errorf("pong's capability: %q", v)
	}
	wantRefused := map[string]int{refusedDeviceNS: 4, refusedOwner: 1}
	wantStripped := map[string]int{strippedFcaps: 1, strippedSetgid: 1}
	if !reflect.DeepEqual(rep.Refused, wantRefused) || !reflect.DeepEqual(rep.Stripped, wantStripped) {
		t.Errorf("refused %v, stripped %v; want %v, %v", rep.Refused, rep.Stripped, wantRefused, wantStripped)
	}
}

// TestCopyBackAttrs: set-id bits on files of another owner or group, file
// capabilities, and attributes of namespaces a container cannot write are
// taken off; user attributes and ACLs naming mapped ids stay.
func TestCopyBackAttrs(t *testing.T) {
	needRoot(t)
	s := newSnapshot(t)
	diff := tarOf(t,
		entry{name: "./", typ: tar.TypeDir},
		entry{name: "mine", content: "x", mode: 0o6755, uid: 1000, gid: 1000},
		entry{name: "theirs", content: "x", mode: 0o6755, uid: 0, gid: 0},
		entry{name: "attrs", content: "x", xattrs: map[string]string{
			"user.kept": "1", "trusted.secret": "2", "security.selinux": "3", "security.capability": fcaps(13),
			"system.posix_acl_access": acl(aclUser, 1500), "weird.ns": "5",
		}},
	)
	p := Policy{UID: 1000, HasUID: true, GIDs: []uint32{1000}}
	rep, err := openCache(t).CopyBack(context.Background(), s.rootfs(t), p, exportOf(changedDiff(diff), nil))
	if err != nil {
		t.Fatal(err)
	}
	got := tree(t, s.upper)
	if got["mine"] != "f 6755 1000:1000 x" || got["theirs"] != "f 755 0:0 x" {
		t.Errorf("mine %q, theirs %q", got["mine"], got["theirs"])
	}
	a := filepath.Join(s.upper, "attrs")
	if xattr(a, "user.kept") != "1" || xattr(a, "trusted.secret") != "" || xattr(a, "security.selinux") != "" || xattr(a, "security.capability") != "" || xattr(a, "system.posix_acl_access") == "" {
		t.Errorf("attributes: user %q trusted %q selinux %q caps %q acl %q", xattr(a, "user.kept"), xattr(a, "trusted.secret"),
			xattr(a, "security.selinux"), xattr(a, "security.capability"), xattr(a, "system.posix_acl_access"))
	}
	want := map[string]int{strippedSetuid: 1, strippedSetgid: 1, strippedTrusted: 1, strippedSecurity: 1, strippedFcaps: 1, strippedXattr: 1}
	if !reflect.DeepEqual(rep.Stripped, want) {
		t.Errorf("stripped %v, want %v", rep.Stripped, want)
	}
	// In a user namespace, an ACL naming an unmapped user goes.
	f := newDiffFilter(Policy{UserNS: true, UIDMap: []IDRange{{100000, 65536}}, GIDMap: []IDRange{{100000, 65536}}}, nil, &CopyBackReport{})
	if f.aclInMapping(acl(aclUser, 1500)) || !f.aclInMapping(acl(aclUser, 100001)) || f.aclInMapping(acl(aclGroup, 5)) || f.aclInMapping("junk") {
		t.Error("aclInMapping")
	}
}

// TestCopyBackFailures: a diff over the bound, one the guest says is not
// whole, a truncated one, one with data after its end, and an empty diff
// of a changed layer all fail, and leave the upperdir as it was.
func TestCopyBackFailures(t *testing.T) {
	needRoot(t)
	big := tarOf(t, entry{name: "./", typ: tar.TypeDir}, entry{name: "big", content: strings.Repeat("x", 3<<20)})
	for _, tc := range []struct {
		name  string
		diff  *fakeDiff
		check func(error) bool
	}{
		{"over the bound", changedDiff(big), errdefs.IsResourceExhausted},
		{"not whole", &fakeDiff{r: bytes.NewReader(tarOf(t, entry{name: "./", typ: tar.TypeDir}, entry{name: "a"})), changed: true, err: errdefs.ErrAborted}, errdefs.IsAborted},
		{"truncated", changedDiff(big[:1<<20]), func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }},
		{"data after the end", changedDiff(append(tarOf(t, entry{name: "./", typ: tar.TypeDir}), "junk"...)), errdefs.IsDataLoss},
		{"empty but changed", changedDiff(nil), errdefs.IsDataLoss},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSnapshot(t)
			writeFile(t, filepath.Join(s.upper, "kept"), "as it was\n")
			dir := t.TempDir()
			c, err := Open(filepath.Join(dir, "cache"), WithCopyBackLimits(CopyBackLimits{MaxBytes: 2 << 20}))
			must(t, err)
			_, err = c.CopyBack(context.Background(), s.rootfs(t), allowAll, exportOf(tc.diff, nil))
			if !tc.check(err) {
				t.Fatalf("err = %v", err)
			}
			if tc.name == "over the bound" && !strings.Contains(err.Error(), "rootfs.copy_back_max_bytes") {
				t.Errorf("the error does not name the bound: %v", err)
			}
			if got := tree(t, s.upper); !reflect.DeepEqual(got, map[string]string{".": "d 755 0:0 ", "kept": "f 644 0:0 as it was\n"}) {
				t.Errorf("upperdir changed: %v", got)
			}
			s.checkOutside(t)
		})
	}
}

// TestCopyBackUnchanged: a layer that did not change comes as an empty
// stream and changes nothing.
func TestCopyBackUnchanged(t *testing.T) {
	s := newSnapshot(t)
	writeFile(t, filepath.Join(s.upper, "kept"), "as it was\n")
	rep, err := openCache(t).CopyBack(context.Background(), s.rootfs(t), Policy{}, exportOf(&fakeDiff{r: bytes.NewReader(nil)}, nil))
	if err != nil || rep.Changed {
		t.Fatalf("%+v %v", rep, err)
	}
	s.checkOutside(t)
	// A read-only root is not even asked.
	called := false
	export := func(context.Context, int64) (LayerDiff, error) { called = true; return nil, errors.New("asked") }
	if _, err := openCache(t).CopyBack(context.Background(), Rootfs{Upper: s.upper}, Policy{}, export); err != nil || called {
		t.Fatalf("read-only root: %v, asked %v", err, called)
	}
}

// stallingDiff sends a header's worth, then nothing until its context
// ends, as a guest that stalls.
type stallingDiff struct {
	ctx    context.Context
	header []byte
}

func (d *stallingDiff) Read(p []byte) (int, error) {
	if len(d.header) > 0 {
		n := copy(p, d.header)
		d.header = d.header[n:]
		return n, nil
	}
	<-d.ctx.Done()
	return 0, d.ctx.Err()
}
func (d *stallingDiff) Close() error                                   { return nil }
func (d *stallingDiff) Wait(ctx context.Context) (bool, uint64, error) { return true, 0, nil }

// TestCopyBackTimeout: a guest that stalls cannot hold a delete past the
// copy back's timeout, which the error names.
func TestCopyBackTimeout(t *testing.T) {
	needRoot(t)
	s := newSnapshot(t)
	c, err := Open(filepath.Join(t.TempDir(), "cache"), WithCopyBackLimits(CopyBackLimits{Timeout: 300 * time.Millisecond}))
	must(t, err)
	header := tarOf(t, entry{name: "./", typ: tar.TypeDir})[:512]
	began := time.Now()
	_, err = c.CopyBack(context.Background(), s.rootfs(t), allowAll, func(ctx context.Context, _ int64) (LayerDiff, error) {
		return &stallingDiff{ctx: ctx, header: header}, nil
	})
	if err == nil || !strings.Contains(err.Error(), "rootfs.copy_back_timeout") {
		t.Fatalf("err = %v", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("took %v", took)
	}
	s.checkOutside(t)
}

// TestCopyBackRate: the reads keep to the rate cap.
func TestCopyBackRate(t *testing.T) {
	needRoot(t)
	s := newSnapshot(t)
	c, err := Open(filepath.Join(t.TempDir(), "cache"), WithCopyBackLimits(CopyBackLimits{BytesPerSecond: 1 << 20}))
	must(t, err)
	diff := tarOf(t, entry{name: "./", typ: tar.TypeDir}, entry{name: "f", content: strings.Repeat("x", 512<<10)})
	began := time.Now()
	if _, err := c.CopyBack(context.Background(), s.rootfs(t), allowAll, exportOf(changedDiff(diff), nil)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < 400*time.Millisecond {
		t.Errorf("512 KiB at 1 MiB/s took %v", took)
	}
}
