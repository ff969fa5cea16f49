package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// entry is one file of a layer: a directory, a regular file, a hard link
// (to a file of the same layer) or a symbolic link.
type entry struct {
	typ      byte
	mode     int64
	uid, gid int
	data     []byte
	link     string
}

// dirType is a directory entry's type.
const dirType = tar.TypeDir

// layer is a layer being assembled: entries by path, without the leading
// slash.
type layer map[string]entry

func (l layer) dir(p string, mode int64) { l[p] = entry{typ: tar.TypeDir, mode: mode} }

func (l layer) file(p string, mode int64, data []byte) {
	l[p] = entry{typ: tar.TypeReg, mode: mode, data: data}
}

func (l layer) hardlink(p, target string) { l[p] = entry{typ: tar.TypeLink, link: target} }

func (l layer) symlink(p, target string) {
	l[p] = entry{typ: tar.TypeSymlink, mode: 0o777, link: target}
}

// epoch is every entry's mtime, and the images' creation time: an image is
// the same on every build.
var epoch = time.Unix(0, 0).UTC()

// build writes the layer as an uncompressed tar, parents before children,
// hard links after their targets.
func (l layer) build() (v1.Layer, error) {
	names := make([]string, 0, len(l))
	for n := range l {
		names = append(names, n)
	}
	// Parents sort before children; links go last so that their targets
	// come first whatever the names.
	sort.Slice(names, func(i, j int) bool {
		li, lj := l[names[i]].typ == tar.TypeLink, l[names[j]].typ == tar.TypeLink
		if li != lj {
			return lj
		}
		return names[i] < names[j]
	})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := l[n]
		if e.typ == tar.TypeLink {
			t, ok := l[e.link]
			if !ok || t.typ != tar.TypeReg {
				return nil, fmt.Errorf("hard link %s: no file %s in the layer", n, e.link)
			}
			// A link's header carries its target's mode and owner, as
			// Docker's do: unpackers (containerd's) apply them to the
			// inode the two names share.
			e.mode, e.uid, e.gid = t.mode, t.uid, t.gid
		}
		h := &tar.Header{Typeflag: e.typ, Name: n, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Linkname: e.link, ModTime: epoch, Format: tar.FormatPAX}
		if e.typ == tar.TypeDir {
			h.Name += "/"
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	// Gzip-compressed, OCI media types: as registries serve layers.
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// The busybox image's users and groups (docker.io/library/busybox), which
// the e2e busybox image has: the specs run as "nobody" by name.
const (
	busyboxPasswd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
`
	busyboxGroup = `root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
lp:x:7:
mail:x:8:
kmem:x:9:
wheel:x:10:root
cdrom:x:11:
dialout:x:18:
floppy:x:19:
video:x:28:
audio:x:29:
tape:x:32:
www-data:x:33:
operator:x:37:
utmp:x:43:
plugdev:x:46:
staff:x:50:
lock:x:54:
netdev:x:82:
users:x:100:
nogroup:x:65534:
`
)

// standinApplets are the programs of the standin binary that every image
// has on its PATH, as the busybox image has them (Debian's busybox-static
// lacks them).
var standinApplets = []string{"pgrep", "ipcs"}

// baseLayer is the layer every stand-in image starts from: a busybox
// userland as the busybox image lays it out (every applet a hard link to
// /bin/busybox in /bin, so that masking one path masks that applet only)
// with the shared libraries the busybox binary needs (the host's, at the
// same paths, as busybox:glibc has them), the standin binary at
// /bin/standin with its applets, and busybox's /etc/passwd and /etc/group.
func baseLayer(busybox, standin string) (layer, error) {
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("%w (install busybox-static)", err)
	}
	list, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	si, err := os.ReadFile(standin)
	if err != nil {
		return nil, err
	}
	libs, err := sharedLibraries(busybox)
	if err != nil {
		return nil, err
	}
	l := layer{}
	for p, data := range libs {
		l.parentDirs(p, nil)
		l.file(p, 0o755, data)
	}
	for _, d := range []string{"bin", "dev", "etc", "home", "proc", "run", "sys", "usr", "usr/bin", "usr/sbin",
		"usr/local", "usr/local/bin", "var", "var/spool", "var/spool/mail", "var/www"} {
		l.dir(d, 0o755)
	}
	l.dir("root", 0o700)
	l.dir("tmp", 0o1777)
	l.symlink("var/run", "../run")
	l.file("bin/busybox", 0o755, bb)
	for _, a := range strings.Fields(string(list)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			l.hardlink("bin/"+a, "bin/busybox")
		}
	}
	l.file("bin/standin", 0o755, si)
	for _, a := range standinApplets {
		l.hardlink("bin/"+a, "bin/standin")
	}
	l.file("etc/passwd", 0o644, []byte(busyboxPasswd))
	l.file("etc/group", 0o644, []byte(busyboxGroup))
	return l, nil
}

// usrPath is the image's PATH (the busybox image's).
const usrPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// parentDirs adds the directories above p that neither l nor have has,
// as 0755: a tar without them would still apply, but with directories of
// whatever mode the unpacker picks.
func (l layer) parentDirs(p string, have layer) {
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := have[d]; ok {
			continue
		}
		if _, ok := l[d]; !ok {
			l.dir(d, 0o755)
		}
	}
}

// sharedLibraries are the files, by path without the leading slash, that
// the dynamic loader maps for binary (ldd's absolute paths: its loader and
// libraries), with their contents; none for a static binary.
func sharedLibraries(binary string) (map[string][]byte, error) {
	out, err := exec.Command("ldd", binary).Output()
	if err != nil {
		// "not a dynamic executable"
		return nil, nil
	}
	libs := map[string][]byte{}
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if !strings.HasPrefix(f, "/") {
				continue
			}
			data, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("%s needs %s: %w", binary, f, err)
			}
			libs[strings.TrimPrefix(path.Clean(f), "/")] = data
		}
	}
	return libs, nil
}
