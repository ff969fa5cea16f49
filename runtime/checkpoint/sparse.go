package checkpoint

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// The sparse encoding of a disk image stores only the image's data, so
// that a container's 10 GiB scratch disk that holds 30 MiB costs 30 MiB
// in the checkpoint: containerd tars the checkpoint directory, and its
// tar keeps no holes.
//
// Layout, every integer little endian:
//
//	magic    "CCNSPRS1"                       8 bytes
//	size     uint64                           the image's nominal size
//	count    uint32                           the number of extents, at most 1<<20
//	flags    uint32                           0
//	extents  count × {offset uint64, length uint64}
//	data     the bytes of each extent, in table order, back to back
//
// Extents are sorted and do not overlap; each is not empty, starts on a
// 4 KiB boundary, lies inside size, and is a multiple of 4 KiB long
// unless it ends at size. Nothing follows the last extent's data.
// Everything outside the extents is zeros (holes, once decoded).
const (
	sparseMagic     = "CCNSPRS1"
	sparseHeaderLen = 24
	sparseExtentLen = 16
	// sparseBlock is the unit of the encoding: extents are aligned to
	// it, and the encoder drops data blocks of it that are all zeros.
	sparseBlock = 4096
	// maxSparseExtents bounds the table: 16 MiB of it at most.
	maxSparseExtents = 1 << 20
	// sparseChunk is the unit of reads and writes of data.
	sparseChunk = 1 << 20
)

// SparseInfo describes a sparse image.
type SparseInfo struct {
	// Size is the image's nominal size in bytes.
	Size int64
	// DataBytes is how much of it the encoding stores.
	DataBytes int64
	// Extents is the number of extents of data.
	Extents int
}

// extent is a range of an image that the encoding stores.
type extent struct{ off, len int64 }

// zeroBlock is compared against to find blocks of zeros.
var zeroBlock [sparseBlock]byte

// WriteSparse encodes the disk image src, a regular file, to dst. It
// reads only src's data, found with SEEK_DATA and SEEK_HOLE (so a 10 GiB
// image that holds 30 MiB costs 30 MiB of reads, twice: once to find the
// extents the table needs first, once to copy them), and drops the
// all-zero 4 KiB blocks inside that data too. It moves src's file offset.
func WriteSparse(dst io.Writer, src *os.File) (SparseInfo, error) {
	return writeSparse(dst, src, maxSparseExtents)
}

// writeSparse is WriteSparse with the table bounded to maxExtents.
func writeSparse(dst io.Writer, src *os.File, maxExtents int) (SparseInfo, error) {
	st, err := src.Stat()
	if err != nil {
		return SparseInfo{}, fmt.Errorf("sparse encode %s: %w", src.Name(), err)
	}
	if !st.Mode().IsRegular() {
		return SparseInfo{}, fmt.Errorf("sparse encode %s: not a regular file: %w", src.Name(), errdefs.ErrInvalidArgument)
	}
	size := st.Size()
	exts, err := findData(src, size, maxExtents)
	if err != nil {
		return SparseInfo{}, err
	}
	info := SparseInfo{Size: size, Extents: len(exts)}
	// bufio keeps the first write error; the data's writes and Flush
	// report it.
	bw := bufio.NewWriterSize(dst, sparseChunk)
	var rec [sparseHeaderLen]byte
	copy(rec[:8], sparseMagic)
	binary.LittleEndian.PutUint64(rec[8:], uint64(size))
	binary.LittleEndian.PutUint32(rec[16:], uint32(len(exts)))
	bw.Write(rec[:])
	for _, e := range exts {
		binary.LittleEndian.PutUint64(rec[0:], uint64(e.off))
		binary.LittleEndian.PutUint64(rec[8:], uint64(e.len))
		bw.Write(rec[:sparseExtentLen])
	}
	buf := make([]byte, sparseChunk)
	for _, e := range exts {
		for p, end := e.off, e.off+e.len; p < end; {
			n := min(int64(len(buf)), end-p)
			if err := readAt(src, buf[:n], p); err != nil {
				return SparseInfo{}, err
			}
			if _, err := bw.Write(buf[:n]); err != nil {
				return SparseInfo{}, fmt.Errorf("sparse encode %s: write: %w", src.Name(), err)
			}
			p += n
		}
		info.DataBytes += e.len
	}
	if err := bw.Flush(); err != nil {
		return SparseInfo{}, fmt.Errorf("sparse encode %s: write: %w", src.Name(), err)
	}
	return info, nil
}

// findData lists the extents of src's first size bytes that hold
// anything but zeros, block-aligned, at most maxExtents of them.
func findData(src *os.File, size int64, maxExtents int) ([]extent, error) {
	l := extentList{max: maxExtents}
	buf := make([]byte, sparseChunk)
	for off := int64(0); off < size; {
		start, end, err := nextData(src, off, size)
		if err != nil {
			return nil, err
		}
		if start >= size {
			break
		}
		// A file system of blocks smaller than the encoding's reports
		// data at finer offsets; the encoding's blocks around it are
		// read whole (what lies in the holes reads as zeros).
		start = max(start&^(sparseBlock-1), off)
		end = min((end+sparseBlock-1)&^(sparseBlock-1), size)
		for p := start; p < end; {
			n := min(int64(len(buf)), end-p)
			if err := readAt(src, buf[:n], p); err != nil {
				return nil, err
			}
			for b := int64(0); b < n; b += sparseBlock {
				blk := buf[b:min(b+sparseBlock, n)]
				if !bytes.Equal(blk, zeroBlock[:len(blk)]) {
					l.add(p+b, int64(len(blk)))
				}
			}
			p += n
		}
		off = end
	}
	return l.exts, nil
}

// nextData returns the next range of data of src at or after off:
// [start, end), start == size if there is none. A file system that
// cannot say where its holes are has its whole rest read as data.
func nextData(src *os.File, off, size int64) (start, end int64, _ error) {
	start, err := src.Seek(off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, syscall.ENXIO):
		return size, size, nil
	case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.EOPNOTSUPP):
		return off, size, nil
	case err != nil:
		return 0, 0, fmt.Errorf("sparse encode %s: find data: %w", src.Name(), err)
	}
	end, err = src.Seek(start, unix.SEEK_HOLE)
	if err != nil {
		return start, size, nil
	}
	return start, end, nil
}

// readAt fills buf from src at off.
func readAt(src *os.File, buf []byte, off int64) error {
	if _, err := src.ReadAt(buf, off); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("sparse encode %s: it shrank while it was read: %w", src.Name(), errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("sparse encode %s: read: %w", src.Name(), err)
	}
	return nil
}

// extentList collects extents in order, merging those that touch and,
// when there would be more than max, those with small gaps between them:
// the gaps' zeros are then stored, and the table stays bounded.
type extentList struct {
	exts []extent
	// gap is the largest gap merged; it doubles at each coarsening.
	gap int64
	max int
}

func (l *extentList) add(off, n int64) {
	if k := len(l.exts); k > 0 {
		if last := &l.exts[k-1]; off-(last.off+last.len) <= l.gap {
			last.len = off + n - last.off
			return
		}
	}
	l.exts = append(l.exts, extent{off, n})
	for len(l.exts) > l.max {
		l.coarsen()
	}
}

func (l *extentList) coarsen() {
	l.gap = max(2*l.gap, sparseBlock)
	out := l.exts[:1]
	for _, e := range l.exts[1:] {
		if last := &out[len(out)-1]; e.off-(last.off+last.len) <= l.gap {
			last.len = e.off + e.len - last.off
		} else {
			out = append(out, e)
		}
	}
	l.exts = out
}

// sparseTarget is what ReadSparse writes to: an *os.File, or a test's
// recorder.
type sparseTarget interface {
	io.WriterAt
	Truncate(size int64) error
}

// ReadSparse decodes a sparse image from src into dst, refusing anything
// but a well-formed one of nominal size at most maxSize: the magic, the
// bounds of the table (checked before anything is allocated for it),
// every extent (sorted, not overlapping, aligned, inside the size), data
// of exactly the declared length and nothing after it. dst is emptied
// first, gets only its non-zero 4 KiB blocks written (pwrite), at their
// offsets, and is then truncated to the image's size, so it stays
// sparse. On error dst is emptied again; the caller removes it. Every
// refusal wraps ErrInvalid.
func ReadSparse(src io.Reader, dst *os.File, maxSize int64) (SparseInfo, error) {
	name := ""
	if n, ok := src.(interface{ Name() string }); ok {
		name = n.Name()
	}
	return readSparse(src, dst, maxSize, name)
}

// sparseInvalidf is the refusal of the sparse image name.
func sparseInvalidf(name, format string, args ...any) error {
	if name != "" {
		name = " " + name
	}
	return fmt.Errorf("sparse image%s: %s: %w", name, fmt.Sprintf(format, args...), invalidClass{})
}

func readSparse(src io.Reader, dst sparseTarget, maxSize int64, name string) (_ SparseInfo, retErr error) {
	if err := dst.Truncate(0); err != nil {
		return SparseInfo{}, fmt.Errorf("sparse image %s: empty the target: %w", name, err)
	}
	defer func() {
		if retErr != nil {
			_ = dst.Truncate(0)
		}
	}()
	br := bufio.NewReaderSize(src, 64<<10)
	readErr := func(err error, where string) error {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return sparseInvalidf(name, "truncated in %s", where)
		}
		return fmt.Errorf("sparse image %s: read %s: %w", name, where, err)
	}

	var hdr [sparseHeaderLen]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return SparseInfo{}, readErr(err, "its header")
	}
	if string(hdr[:8]) != sparseMagic {
		return SparseInfo{}, sparseInvalidf(name, "not a Cocoon sparse image (magic %q, want %q)", hdr[:8], sparseMagic)
	}
	size64 := binary.LittleEndian.Uint64(hdr[8:])
	if maxSize < 0 || size64 > uint64(maxSize) {
		return SparseInfo{}, sparseInvalidf(name, "its size %d is over the bound of %d", size64, max(maxSize, 0))
	}
	size := int64(size64)
	count := binary.LittleEndian.Uint32(hdr[16:])
	if flags := binary.LittleEndian.Uint32(hdr[20:]); flags != 0 {
		return SparseInfo{}, sparseInvalidf(name, "unknown flags %#x", flags)
	}
	// No more extents than blocks: the table's allocation is bounded by
	// the size, itself bounded by maxSize, as well as by the count bound.
	blocks := (size + sparseBlock - 1) / sparseBlock
	if count > maxSparseExtents || int64(count) > blocks {
		return SparseInfo{}, sparseInvalidf(name, "%d extents, over the bound of %d for its size %d",
			count, min(int64(maxSparseExtents), blocks), size)
	}

	exts := make([]extent, 0, min(int(count), 4096))
	var dataBytes, prevEnd uint64
	for i := range int(count) {
		var rec [sparseExtentLen]byte
		if _, err := io.ReadFull(br, rec[:]); err != nil {
			return SparseInfo{}, readErr(err, fmt.Sprintf("its extent table (extent %d of %d)", i, count))
		}
		off, n := binary.LittleEndian.Uint64(rec[0:]), binary.LittleEndian.Uint64(rec[8:])
		switch {
		case n == 0:
			return SparseInfo{}, sparseInvalidf(name, "extent %d is empty", i)
		case off%sparseBlock != 0:
			return SparseInfo{}, sparseInvalidf(name, "extent %d at offset %d is not 4 KiB aligned", i, off)
		case off >= size64 || n > size64-off:
			return SparseInfo{}, sparseInvalidf(name, "extent %d (%d bytes at %d) goes past the size %d", i, n, off, size64)
		case off < prevEnd:
			return SparseInfo{}, sparseInvalidf(name, "extent %d at %d overlaps or precedes the extent before it, which ends at %d", i, off, prevEnd)
		case n%sparseBlock != 0 && off+n != size64:
			return SparseInfo{}, sparseInvalidf(name, "extent %d is %d bytes, not a multiple of 4 KiB, and does not end at the size", i, n)
		}
		prevEnd = off + n
		dataBytes += n
		exts = append(exts, extent{int64(off), int64(n)})
	}

	var buf []byte
	if dataBytes > 0 {
		buf = make([]byte, min(sparseChunk, (dataBytes+sparseBlock-1)&^(sparseBlock-1)))
	}
	for i, e := range exts {
		for p, end := e.off, e.off+e.len; p < end; {
			n := min(int64(len(buf)), end-p)
			if _, err := io.ReadFull(br, buf[:n]); err != nil {
				return SparseInfo{}, readErr(err, fmt.Sprintf("the data of extent %d (%d bytes at %d)", i, e.len, e.off))
			}
			if err := writeNonZero(dst, buf[:n], p); err != nil {
				return SparseInfo{}, fmt.Errorf("sparse image %s: write: %w", name, err)
			}
			p += n
		}
	}
	var one [1]byte
	if _, err := io.ReadFull(br, one[:]); err == nil {
		return SparseInfo{}, sparseInvalidf(name, "data follows the last extent's")
	} else if !errors.Is(err, io.EOF) {
		return SparseInfo{}, fmt.Errorf("sparse image %s: read: %w", name, err)
	}
	if err := dst.Truncate(size); err != nil {
		return SparseInfo{}, fmt.Errorf("sparse image %s: set the size: %w", name, err)
	}
	return SparseInfo{Size: size, DataBytes: int64(dataBytes), Extents: len(exts)}, nil
}

// writeNonZero writes the blocks of data that are not all zeros to dst
// at off (block-aligned), a run of them per write.
func writeNonZero(dst io.WriterAt, data []byte, off int64) error {
	run := -1 // start of the current run of non-zero blocks, -1 if none
	flush := func(end int) error {
		if run < 0 {
			return nil
		}
		_, err := dst.WriteAt(data[run:end], off+int64(run))
		run = -1
		return err
	}
	for b := 0; b < len(data); b += sparseBlock {
		end := min(b+sparseBlock, len(data))
		if bytes.Equal(data[b:end], zeroBlock[:end-b]) {
			if err := flush(b); err != nil {
				return err
			}
		} else if run < 0 {
			run = b
		}
	}
	return flush(len(data))
}
