//go:build linux

package agent

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Names of the OCI image-layer format and of overlayfs that a layer diff
// translates between.
const (
	// whiteoutPrefix names a deleted entry: .wh.<name>.
	whiteoutPrefix = ".wh."
	// whiteoutOpaque in a directory hides what the lower layers hold in it.
	whiteoutOpaque = ".wh..wh..opq"
	// paxXattr prefixes an extended attribute's PAX record.
	paxXattr = "SCHILY.xattr."
	// overlayXattr prefixes overlayfs' own attributes (opaque, origin,
	// redirect...), which describe the upper layer, not the files.
	overlayXattr = "trusted.overlay."
	// overlayOpaque marks an opaque directory when its value is "y".
	overlayOpaque = overlayXattr + "opaque"
)

// diffBuffer is how much of a layer diff is gathered before a write to
// the stream: fewer, larger frames on the agent channel.
const diffBuffer = 256 << 10

// diffStats counts what a layer diff held.
type diffStats struct {
	// bytes is the size of the tar, entries its number of entries.
	bytes, entries uint64
}

// writeLayerDiff writes the overlayfs upper directory upper to w as a
// layer diff in the OCI image-layer format: a tar whose entries are in
// name order, each directory before what it holds, the root first as
// "./" (it carries the container's root directory's owner, mode and
// attributes). overlayfs' whiteouts (character devices 0/0) become
// .wh.<name> files and opaque directories (trusted.overlay.opaque=y) get
// a .wh..wh..opq entry after them; names that share an inode become tar
// hard links to the first; extended attributes are PAX records, but
// overlayfs' own; times are modification times to the nanosecond;
// sockets are left out, as containerd's archive leaves them. The tar
// grows to maxBytes at most (0: no bound): past that the write fails with
// errdefs.ErrResourceExhausted.
func writeLayerDiff(ctx context.Context, w io.Writer, upper string, maxBytes uint64) (diffStats, error) {
	cw := &countingWriter{w: w, max: maxBytes}
	bw := bufio.NewWriterSize(cw, diffBuffer)
	tw := tar.NewWriter(bw)
	d := &diffWriter{tw: tw, upper: upper, links: map[inode]string{}, buf: make([]byte, diffBuffer)}
	err := filepath.WalkDir(upper, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		return d.entry(path)
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		if cw.over {
			return diffStats{}, fmt.Errorf("the writable layer is larger than the %d bytes the host takes back: %w", maxBytes, errdefs.ErrResourceExhausted)
		}
		return diffStats{}, err
	}
	return diffStats{bytes: cw.n, entries: d.entries}, nil
}

// inode identifies a file of the upper directory (a single filesystem).
type inode uint64

// diffWriter is one writeLayerDiff.
type diffWriter struct {
	tw    *tar.Writer
	upper string
	// links maps the inodes with several names to the first name written.
	links   map[inode]string
	entries uint64
	// buf carries file content: large reads, few calls (costly in a
	// guest under emulation).
	buf []byte
}

func (d *diffWriter) entry(path string) error {
	rel, err := filepath.Rel(d.upper, path)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	mtime := time.Unix(st.Mtim.Sec, st.Mtim.Nsec)
	format := st.Mode & unix.S_IFMT
	switch {
	case format == unix.S_IFSOCK:
		return nil
	case format == unix.S_IFCHR && st.Rdev == 0:
		// An overlayfs whiteout; overlayfs may link them all to one inode.
		return d.write(&tar.Header{
			Typeflag: tar.TypeReg,
			Name:     filepath.Join(filepath.Dir(rel), whiteoutPrefix+filepath.Base(rel)),
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}, "")
	}
	hdr := &tar.Header{
		Name:    rel,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: mtime,
		Format:  tar.FormatPAX,
	}
	// Attributes go on hard links too: applying one sets the owner,
	// which clears the inode's file capabilities, then sets them again.
	if err := xattrRecords(path, hdr); err != nil {
		return err
	}
	if format != unix.S_IFDIR && st.Nlink > 1 {
		id := inode(st.Ino)
		if first, ok := d.links[id]; ok {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			return d.write(hdr, "")
		}
		d.links[id] = rel
	}
	content := ""
	switch format {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
	case unix.S_IFREG:
		hdr.Typeflag, hdr.Size, content = tar.TypeReg, st.Size, path
	case unix.S_IFLNK:
		hdr.Typeflag = tar.TypeSymlink
		if hdr.Linkname, err = os.Readlink(path); err != nil {
			return err
		}
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if format == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	default:
		return fmt.Errorf("%s: unknown file type %#o", path, format)
	}
	if err := d.write(hdr, content); err != nil {
		return err
	}
	if format == unix.S_IFDIR && rel != "." && opaqueDir(path) {
		return d.write(&tar.Header{
			Typeflag: tar.TypeReg,
			Name:     filepath.Join(rel, whiteoutOpaque),
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}, "")
	}
	return nil
}

// write writes hdr and, for a regular file, the content of the file at
// path, which must still have hdr.Size bytes.
func (d *diffWriter) write(hdr *tar.Header, path string) error {
	if err := d.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("%s: %w", hdr.Name, err)
	}
	d.entries++
	if path == "" || hdr.Size == 0 {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.CopyBuffer(d.tw, io.LimitReader(f, hdr.Size), d.buf)
	if err == nil && n < hdr.Size {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// xattrRecords adds path's extended attributes, but overlayfs' own, to
// hdr as PAX records.
func xattrRecords(path string, hdr *tar.Header) error {
	names, err := listXattrs(path)
	if err != nil {
		return err
	}
	for _, name := range names {
		if strings.HasPrefix(name, overlayXattr) {
			continue
		}
		val, err := getXattr(path, name)
		if errors.Is(err, unix.ENODATA) {
			continue // removed meanwhile
		}
		if err != nil {
			return err
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords[paxXattr+name] = string(val)
	}
	return nil
}

// opaqueDir reports whether overlayfs marked directory dir opaque.
func opaqueDir(dir string) bool {
	v, err := getXattr(dir, overlayOpaque)
	return err == nil && string(v) == "y"
}

func listXattrs(path string) ([]string, error) {
	for {
		size, err := unix.Llistxattr(path, nil)
		if errors.Is(err, unix.ENOTSUP) || size == 0 {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
		}
		buf := make([]byte, size)
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			continue // grew meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
		}
		var names []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
}

func getXattr(path, name string) ([]byte, error) {
	for {
		size, err := unix.Lgetxattr(path, name, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, size)
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// countingWriter counts what goes through it and fails once more than
// max bytes (if max is not 0) would have.
type countingWriter struct {
	w    io.Writer
	max  uint64
	n    uint64
	over bool
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.max != 0 && c.n+uint64(len(p)) > c.max {
		c.over = true
		return 0, errdefs.ErrResourceExhausted
	}
	n, err := c.w.Write(p)
	c.n += uint64(n)
	return n, err
}
