package rootfs

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// fuzzSeeds are diffs worth mutating: a plain one, one with whiteouts
// and an opaque directory, a forged one, and one cut short.
func fuzzSeeds(t testing.TB) [][]byte {
	plain := tarOf(t,
		entry{name: "./", typ: tar.TypeDir},
		entry{name: "etc/", typ: tar.TypeDir},
		entry{name: "etc/hosts", content: "127.0.0.1 here\n", xattrs: map[string]string{"user.a": "b"}},
		entry{name: "etc/hard", typ: tar.TypeLink, link: "etc/hosts"},
		entry{name: "link", typ: tar.TypeSymlink, link: "etc/hosts"},
	)
	whiteouts := tarOf(t,
		entry{name: "./", typ: tar.TypeDir},
		entry{name: ".wh.kept"},
		entry{name: "var/", typ: tar.TypeDir},
		entry{name: "var/.wh..wh..opq"},
		entry{name: "var/new", content: "x"},
	)
	forged := tarOf(t,
		entry{name: "../escape", content: "x"},
		entry{name: "/abs", content: "x"},
		entry{name: "sym", typ: tar.TypeSymlink, link: "/"},
		entry{name: "sym/etc/passwd", content: "x"},
		entry{name: "hl", typ: tar.TypeLink, link: "../../etc/passwd"},
		entry{name: "sda", typ: tar.TypeBlock, major: 8},
		entry{name: ".wh..wh..opq"},
		entry{name: "./", typ: tar.TypeDir, mode: 0o7777, uid: 1 << 40},
	)
	return [][]byte{plain, whiteouts, forged, plain[:700], nil}
}

// FuzzCopyBackDiff feeds the host's decoder of the diff stream (the copy
// back's bounded reader, its policy filter and containerd's archive.Apply)
// whatever a hostile guest could send, into an upperdir (overlayfs'
// whiteouts) or a directory root, under a policy the flags pick. It must
// never panic, never change anything outside the snapshot, and leave an
// upperdir as it was unless the diff was applied whole.
func FuzzCopyBackDiff(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("needs root: the copy back makes whiteouts and sets owners")
	}
	for i, seed := range fuzzSeeds(f) {
		f.Add(seed, byte(i*37))
	}
	c, err := Open(filepath.Join(f.TempDir(), "cache"), WithCopyBackLimits(CopyBackLimits{MaxBytes: 1 << 20, Timeout: 10 * time.Second}))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, flags byte) {
		s := newSnapshot(t)
		writeFile(t, filepath.Join(s.upper, "kept"), "as it was\n")
		writeFile(t, filepath.Join(s.lowers[0], "etc/passwd"), "root:x:0:0::/:/bin/sh\n")
		p := Policy{Mknod: flags&1 != 0, SetFcap: flags&2 != 0, AnySetuid: flags&4 != 0, AnySetgid: flags&8 != 0, HasUID: true}
		if flags&16 != 0 {
			p.Mknod, p.UserNS = false, true
			p.UIDMap, p.GIDMap = []IDRange{{100000, 65536}}, []IDRange{{100000, 65536}}
		}
		r := s.rootfs(t)
		if flags&128 != 0 {
			r.Upper, r.Bind, r.Lowers = "", s.upper, []string{s.upper}
		}
		before := tree(t, s.upper)
		_, err := c.CopyBack(context.Background(), r, p, exportOf(changedDiff(data), nil))
		s.checkOutside(t)
		if err != nil && r.Upper != "" {
			if after := tree(t, s.upper); !reflect.DeepEqual(after, before) {
				t.Errorf("a failed copy back (%v) changed the upperdir: %v", err, after)
			}
		}
	})
}
