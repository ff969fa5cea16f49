package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
)

// fuzzMaxSize is the size bound the fuzzed decoder is given.
const fuzzMaxSize = 1 << 20

// recorder is a ReadSparse target that checks every write against the
// image's declared size.
type recorder struct {
	t *testing.T
	// limit is the declared size, as the test reads the header itself.
	limit int64
	// size is the length Truncate set last.
	size int64
	// written is the number of bytes written.
	written int64
}

func (r *recorder) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > r.limit {
		r.t.Errorf("write of %d bytes at %d, outside [0, %d)", len(p), off, r.limit)
	}
	if bytes.Equal(p[:min(len(p), sparseBlock)], zeroBlock[:min(len(p), sparseBlock)]) {
		r.t.Errorf("write of a zero block at %d", off)
	}
	r.written += int64(len(p))
	return len(p), nil
}

func (r *recorder) Truncate(n int64) error {
	r.size = n
	return nil
}

// FuzzReadSparse: whatever the bytes, ReadSparse does not panic, writes
// only inside the declared size, allocates within its bounds, refuses
// with ErrInvalid, and on success has consumed exactly header, table and
// data.
func FuzzReadSparse(f *testing.F) {
	block := bytes.Repeat([]byte{1}, 4096)
	for _, seed := range [][]byte{
		sparseBytes(3*4096, [][2]uint64{{4096, 4096}}, block),
		sparseBytes(2*4096+10, [][2]uint64{{0, 4096}, {8192, 10}}, append(bytes.Clone(block), "0123456789"...)),
		sparseBytes(4096, nil, nil),
		sparseBytes(4*4096, [][2]uint64{{0, 8192}, {4096, 4096}}, nil),
		sparseBytes(1<<20, [][2]uint64{{0, 1 << 20}}, make([]byte, 1<<10)),
		[]byte(sparseMagic),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		limit := int64(fuzzMaxSize)
		if len(in) >= 16 && string(in[:8]) == sparseMagic {
			if declared := binary.LittleEndian.Uint64(in[8:]); declared < uint64(limit) {
				limit = int64(declared)
			}
		}
		dst := &recorder{t: t, limit: limit, size: -1}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		info, err := readSparse(bytes.NewReader(in), dst, fuzzMaxSize, "fuzz")
		runtime.ReadMemStats(&after)
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
			t.Errorf("decoding %d bytes allocated %d", len(in), alloc)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("refusal %v is not ErrInvalid", err)
			}
			if dst.size != 0 {
				t.Errorf("a refused image left dst at %d bytes", dst.size)
			}
			return
		}
		if dst.size != info.Size || info.Size > fuzzMaxSize {
			t.Errorf("decoded %+v, dst truncated to %d", info, dst.size)
		}
		if want := int64(sparseHeaderLen+sparseExtentLen*info.Extents) + info.DataBytes; int64(len(in)) != want {
			t.Errorf("accepted %d bytes for %+v, which is %d", len(in), info, want)
		}
		if dst.written > info.DataBytes {
			t.Errorf("wrote %d bytes of %d of data", dst.written, info.DataBytes)
		}
	})
}
