package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sparseImage makes a sparse file of size with the given strings written
// at their offsets.
func sparseImage(t testing.TB, size int64, data map[int64]string) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "image"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off, s := range data {
		if _, err := f.WriteAt([]byte(s), off); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// blocks is how many 512-byte blocks f takes on disk.
func blocks(t testing.TB, f *os.File) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks
}

// decodeTo decodes enc into a new file.
func decodeTo(t testing.TB, enc []byte, maxSize int64) (*os.File, SparseInfo) {
	t.Helper()
	dst, err := os.Create(filepath.Join(t.TempDir(), "decoded"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Close() })
	info, err := ReadSparse(bytes.NewReader(enc), dst, maxSize)
	if err != nil {
		t.Fatal(err)
	}
	return dst, info
}

func fileBytes(t testing.TB, f *os.File) []byte {
	t.Helper()
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSparseRoundTrip(t *testing.T) {
	const size = 64<<20 + 123 // not a whole number of blocks
	rnd := rand.New(rand.NewSource(2))
	data := map[int64]string{}
	for _, off := range []int64{0, 4096*3 + 17, 1 << 20, 5<<20 + 4095, 40 << 20, size - 50} {
		b := make([]byte, 1+rnd.Intn(20000))
		rnd.Read(b)
		if off+int64(len(b)) > size {
			b = b[:size-off]
		}
		data[off] = string(b)
	}
	src := sparseImage(t, size, data)
	var enc bytes.Buffer
	info, err := WriteSparse(&enc, src)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != size || info.DataBytes >= 1<<20 || info.Extents == 0 {
		t.Errorf("encoded %+v: want size %d, little data", info, size)
	}
	if want := int64(sparseHeaderLen+sparseExtentLen*info.Extents) + info.DataBytes; int64(enc.Len()) != want {
		t.Errorf("encoding is %d bytes, want header, table and data: %d", enc.Len(), want)
	}
	dst, dinfo := decodeTo(t, enc.Bytes(), size)
	if dinfo != info {
		t.Errorf("decoded %+v, encoded %+v", dinfo, info)
	}
	if !bytes.Equal(fileBytes(t, dst), fileBytes(t, src)) {
		t.Errorf("decoded content differs from the image")
	}
	if got, orig := blocks(t, dst), blocks(t, src); got > orig {
		t.Errorf("decoded image takes %d blocks, the original %d: holes were filled", got, orig)
	}
}

func TestSparseSkipsZeroBlocks(t *testing.T) {
	// Three blocks of data as the file system sees it, the middle one
	// zeros written out.
	src := sparseImage(t, 1<<20, map[int64]string{
		0:    "first",
		4096: string(make([]byte, 4096)),
		8192: "third",
	})
	var enc bytes.Buffer
	info, err := WriteSparse(&enc, src)
	if err != nil {
		t.Fatal(err)
	}
	if info.Extents != 2 || info.DataBytes != 2*4096 {
		t.Errorf("encoded %+v: want 2 extents of one block each", info)
	}
	dst, _ := decodeTo(t, enc.Bytes(), 1<<20)
	if !bytes.Equal(fileBytes(t, dst), fileBytes(t, src)) {
		t.Errorf("decoded content differs")
	}
	if got := blocks(t, dst); got > 2*8 {
		t.Errorf("decoded image takes %d sectors, want the 2 data blocks", got)
	}
}

func TestSparseEmptyAndHoleOnly(t *testing.T) {
	for _, size := range []int64{0, 1, 4096, 10 << 20} {
		src := sparseImage(t, size, nil)
		var enc bytes.Buffer
		info, err := WriteSparse(&enc, src)
		if err != nil {
			t.Fatal(err)
		}
		if info.Extents != 0 || enc.Len() != sparseHeaderLen {
			t.Errorf("size %d: %+v in %d bytes, want a bare header", size, info, enc.Len())
		}
		dst, _ := decodeTo(t, enc.Bytes(), size)
		if st, _ := dst.Stat(); st.Size() != size {
			t.Errorf("size %d decoded as %d", size, st.Size())
		}
	}
}

// TestSparseBoundsTheTable: an image with more extents than the bound
// merges the nearest ones, storing their gaps' zeros, and still decodes.
func TestSparseBoundsTheTable(t *testing.T) {
	data := map[int64]string{}
	for i := range int64(9) {
		data[i*3*4096+i*i*4096] = "x"
	}
	src := sparseImage(t, 1<<20, data)
	var enc bytes.Buffer
	info, err := writeSparse(&enc, src, 4)
	if err != nil {
		t.Fatal(err)
	}
	if info.Extents > 4 {
		t.Errorf("%d extents, bound 4", info.Extents)
	}
	dst, _ := decodeTo(t, enc.Bytes(), 1<<20)
	if !bytes.Equal(fileBytes(t, dst), fileBytes(t, src)) {
		t.Errorf("decoded content differs")
	}
}

// TestSparseLargeImageIsFast: a 10 GiB image with 30 MiB of data is
// encoded reading its data only.
func TestSparseLargeImageIsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 30 MiB")
	}
	const size = 10 << 30
	src := sparseImage(t, size, nil)
	chunk := make([]byte, 1<<20)
	rand.New(rand.NewSource(3)).Read(chunk)
	for i := range int64(30) {
		if _, err := src.WriteAt(chunk, i*(size/30)&^4095); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	h := sha256.New()
	info, err := WriteSparse(h, src)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if info.DataBytes != 30<<20 || info.Extents != 30 {
		t.Errorf("encoded %+v, want 30 MiB in 30 extents", info)
	}
	if took > 10*time.Second {
		t.Errorf("encoding took %v: the holes were read", took)
	}
	t.Logf("10 GiB image, 30 MiB of data: encoded in %v", took)
}

// sparseBytes builds an encoding by hand: a header of size with the
// extents given, then data.
func sparseBytes(size uint64, exts [][2]uint64, data []byte) []byte {
	b := []byte(sparseMagic)
	b = binary.LittleEndian.AppendUint64(b, size)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(exts)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	for _, e := range exts {
		b = binary.LittleEndian.AppendUint64(b, e[0])
		b = binary.LittleEndian.AppendUint64(b, e[1])
	}
	return append(b, data...)
}

func TestReadSparseRefusals(t *testing.T) {
	block := bytes.Repeat([]byte{7}, 4096)
	valid := sparseBytes(3*4096, [][2]uint64{{4096, 4096}}, block)
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "truncated in its header"},
		{"short header", valid[:20], "truncated in its header"},
		{"bad magic", append([]byte("CCNSPRS2"), valid[8:]...), `not a Cocoon sparse image (magic "CCNSPRS2"`},
		{"over the size bound", sparseBytes(1<<40, nil, nil), "its size 1099511627776 is over the bound of 1048576"},
		{"size over int64", sparseBytes(1<<63+5, nil, nil), "is over the bound"},
		{"flags", func() []byte { b := sparseBytes(4096, nil, nil); b[20] = 1; return b }(), "unknown flags 0x1"},
		{"more extents than blocks", sparseBytes(4096, [][2]uint64{{0, 1}, {1, 1}}, nil), "2 extents, over the bound of 1 for its size 4096"},
		{"count far over the bound", func() []byte {
			b := sparseBytes(1<<20, nil, nil)
			binary.LittleEndian.PutUint32(b[16:], 1<<31)
			return b
		}(), "2147483648 extents, over the bound"},
		{"truncated table", sparseBytes(3*4096, [][2]uint64{{0, 4096}, {4096, 4096}}, nil)[:sparseHeaderLen+20], "truncated in its extent table (extent 1 of 2)"},
		{"empty extent", sparseBytes(3*4096, [][2]uint64{{0, 0}}, nil), "extent 0 is empty"},
		{"unaligned extent", sparseBytes(3*4096, [][2]uint64{{100, 4096}}, block), "extent 0 at offset 100 is not 4 KiB aligned"},
		{"extent past the size", sparseBytes(3*4096, [][2]uint64{{8192, 8192}}, nil), "extent 0 (8192 bytes at 8192) goes past the size 12288"},
		{"extent at the size", sparseBytes(3*4096, [][2]uint64{{12288, 4096}}, nil), "goes past the size"},
		{"extent length overflowing", sparseBytes(3*4096, [][2]uint64{{4096, 1<<64 - 4096}}, nil), "goes past the size"},
		{"overlapping extents", sparseBytes(4*4096, [][2]uint64{{0, 8192}, {4096, 4096}}, nil), "extent 1 at 4096 overlaps or precedes the extent before it, which ends at 8192"},
		{"unsorted extents", sparseBytes(4*4096, [][2]uint64{{8192, 4096}, {0, 4096}}, nil), "extent 1 at 0 overlaps or precedes"},
		{"odd length inside", sparseBytes(4*4096, [][2]uint64{{0, 100}}, nil), "extent 0 is 100 bytes, not a multiple of 4 KiB, and does not end at the size"},
		{"data short", valid[:len(valid)-1], "truncated in the data of extent 0 (4096 bytes at 4096)"},
		{"data missing", valid[:len(valid)-4096], "truncated in the data of extent 0"},
		{"trailing data", append(bytes.Clone(valid), 0), "data follows the last extent's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst, err := os.Create(filepath.Join(t.TempDir(), "dst"))
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			_, err = readSparse(bytes.NewReader(tc.in), dst, 1<<20, "disk-c1.sparse")
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v, want ErrInvalid", err)
			}
			if !strings.HasPrefix(err.Error(), "sparse image disk-c1.sparse: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if st, _ := dst.Stat(); st.Size() != 0 {
				t.Errorf("a refused image left %d bytes in dst", st.Size())
			}
		})
	}
	dst, _ := decodeTo(t, valid, 1<<20)
	if got := fileBytes(t, dst); !bytes.Equal(got, append(append(make([]byte, 4096), block...), make([]byte, 4096)...)) {
		t.Errorf("the valid encoding decodes wrong")
	}
}

// TestReadSparseEmptiesTheTarget: what dst held before is gone, holes
// included.
func TestReadSparseEmptiesTheTarget(t *testing.T) {
	dst, err := os.Create(filepath.Join(t.TempDir(), "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	dst.Write(bytes.Repeat([]byte{0xff}, 3*4096))
	enc := sparseBytes(2*4096+10, [][2]uint64{{8192, 10}}, []byte("0123456789"))
	if _, err := ReadSparse(bytes.NewReader(enc), dst, 1<<20); err != nil {
		t.Fatal(err)
	}
	want := append(make([]byte, 8192), "0123456789"...)
	if got := fileBytes(t, dst); !bytes.Equal(got, want) {
		t.Errorf("decoded over old content: got %d bytes, not the image", len(got))
	}
}

// TestReadSparseNamesTheFile: reading from a file, errors name it.
func TestReadSparseNamesTheFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "disk-c1.sparse")
	os.WriteFile(p, []byte("garbage"), 0o600)
	src, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(filepath.Join(t.TempDir(), "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := ReadSparse(src, dst, 1<<20); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("error %v does not name %s", err, p)
	}
}
