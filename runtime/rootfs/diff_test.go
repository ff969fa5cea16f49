package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeDiff is a guest's export as a unit test stages it: the stream r
// and the account Wait gives.
type fakeDiff struct {
	r       io.Reader
	changed bool
	entries uint64
	// err is what Wait returns: the guest's failure.
	err    error
	closed bool
}

func (d *fakeDiff) Read(p []byte) (int, error) { return d.r.Read(p) }
func (d *fakeDiff) Close() error               { d.closed = true; return nil }
func (d *fakeDiff) Wait(ctx context.Context) (bool, uint64, error) {
	return d.changed, d.entries, d.err
}

// exportOf is an Exporter that hands out d, and records the bound asked.
func exportOf(d *fakeDiff, asked *int64) Exporter {
	return func(ctx context.Context, maxBytes int64) (LayerDiff, error) {
		if asked != nil {
			*asked = maxBytes
		}
		return d, nil
	}
}

// changedDiff is the export of a changed layer whose diff is the tar b.
func changedDiff(b []byte) *fakeDiff {
	return &fakeDiff{r: bytes.NewReader(b), changed: true}
}

// entry is one tar entry of a staged diff.
type entry struct {
	name     string
	typ      byte
	mode     int64
	uid, gid int
	content  string
	link     string
	major    int64
	minor    int64
	xattrs   map[string]string
	mtime    time.Time
}

// tarOf writes entries as a tar, the root directory first unless the
// entries name one.
func tarOf(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 && typ != tar.TypeReg {
			mode = 0o755
		} else if mode == 0 {
			mode = 0o644
		}
		mtime := e.mtime
		if mtime.IsZero() {
			mtime = time.Unix(981173106, 0)
		}
		h := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Uid: e.uid, Gid: e.gid, Linkname: e.link,
			Devmajor: e.major, Devminor: e.minor, ModTime: mtime, Format: tar.FormatPAX}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.content))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords[paxXattr+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(e.content)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// snapDirs is an overlay snapshot as containerd lays it out: lower layers
// and the upperdir the scratch disk was seeded from, with a sibling
// directory standing for what is outside the snapshot (the host's /etc).
type snapDirs struct {
	root, upper, outside string
	lowers               []string
}

func newSnapshot(t *testing.T) *snapDirs {
	t.Helper()
	root := t.TempDir()
	s := &snapDirs{root: root, upper: filepath.Join(root, "snapshots/2/fs"), outside: filepath.Join(root, "etc"),
		lowers: []string{filepath.Join(root, "snapshots/1/fs")}}
	for _, d := range append([]string{s.upper, s.outside}, s.lowers...) {
		must(t, os.MkdirAll(d, 0o755))
	}
	writeFile(t, filepath.Join(s.outside, "passwd"), "root:x:0:0::/root:/bin/sh\n")
	return s
}

// rootfs is the container's Rootfs on the snapshot.
func (s *snapDirs) rootfs(t *testing.T) Rootfs {
	dir := t.TempDir()
	return Rootfs{Dir: dir, Scratch: filepath.Join(dir, ScratchFile), Upper: s.upper, Lowers: s.lowers}
}

// tree lists what dir holds, path -> "type mode uid:gid [content|target|rdev]".
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = describe(t, p, fi)
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return out
}

// checkOutside fails t unless the snapshot's surroundings are as
// newSnapshot made them: nothing outside the upperdir changed.
func (s *snapDirs) checkOutside(t *testing.T) {
	t.Helper()
	want := map[string]string{".": "", "passwd": ""}
	got := tree(t, s.outside)
	if len(got) != len(want) {
		t.Errorf("outside the snapshot: %v", got)
	}
	if b, err := os.ReadFile(filepath.Join(s.outside, "passwd")); err != nil || string(b) != "root:x:0:0::/root:/bin/sh\n" {
		t.Errorf("outside/passwd = %q, %v", b, err)
	}
	top, _ := os.ReadDir(s.root)
	for _, e := range top {
		if e.Name() != "snapshots" && e.Name() != "etc" {
			t.Errorf("%s appeared next to the snapshots", e.Name())
		}
	}
	snaps, _ := os.ReadDir(filepath.Dir(filepath.Dir(s.upper)))
	for _, e := range snaps {
		if e.Name() != "1" && e.Name() != "2" {
			t.Errorf("%s appeared among the snapshots", e.Name())
		}
	}
	inSnap, _ := os.ReadDir(filepath.Dir(s.upper))
	for _, e := range inSnap {
		if e.Name() != "fs" {
			t.Errorf("%s left next to the upperdir", e.Name())
		}
	}
}

// describe says what p is: "type mode uid:gid detail".
func describe(t *testing.T, p string, fi os.FileInfo) string {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	detail := ""
	typ := "?"
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		typ = "f"
		b, err := os.ReadFile(p)
		must(t, err)
		detail = string(b)
	case unix.S_IFDIR:
		typ = "d"
	case unix.S_IFLNK:
		typ = "l"
		detail, _ = os.Readlink(p)
	case unix.S_IFCHR:
		typ = "c"
		detail = fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFBLK:
		typ = "b"
		detail = fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		typ = "p"
	}
	return fmt.Sprintf("%s %o %d:%d %s", typ, st.Mode&0o7777, st.Uid, st.Gid, detail)
}

// xattr reads attribute name of p, "" if it has none.
func xattr(p, name string) string {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// fcaps is a security.capability value (VFS_CAP_REVISION_2) giving the
// capability numbered bit, effective and permitted.
func fcaps(bit uint) string {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000001)
	binary.LittleEndian.PutUint32(b[4:], 1<<bit)
	return string(b)
}

// acl is a POSIX access ACL in its xattr form naming one user (tag
// aclUser) or group (aclGroup) id, with the entries an ACL needs.
func acl(tag uint16, id uint32) string {
	const (
		userObj  = 0x01
		groupObj = 0x04
		mask     = 0x10
		other    = 0x20
		noID     = 0xffffffff
	)
	type ent struct {
		tag uint16
		id  uint32
	}
	ents := []ent{{userObj, noID}, {groupObj, noID}, {mask, noID}, {other, noID}}
	if tag == aclUser {
		ents = append([]ent{ents[0], {aclUser, id}}, ents[1:]...)
	} else {
		ents = append([]ent{ents[0], ents[1], {aclGroup, id}}, ents[2:]...)
	}
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range ents {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, 6)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return string(b)
}
