package hooks

import (
	"strings"
	"testing"
)

func TestTailKeepsTheEnd(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string
		want   string
		cut    bool
	}{
		{"nothing", nil, "", false},
		{"fits", []string{"ab", "cd"}, "abcd", false},
		{"exactly", []string{"abcdefgh"}, "abcdefgh", false},
		{"one big write", []string{"0123456789"}, "23456789", true},
		{"many small", []string{"012", "345", "678", "9"}, "23456789", true},
		{"small then big", []string{"a", "0123456789"}, "23456789", true},
		{"trimmed", []string{"\n x  \n"}, "x", false},
		// A cut through a character drops its remains.
		{"rune boundary", []string{"é", "abcdefg"}, "abcdefg", true},
	} {
		tl := newTail(8)
		for _, w := range tc.writes {
			if n, err := tl.Write([]byte(w)); n != len(w) || err != nil {
				t.Fatalf("%s: Write = %d, %v", tc.name, n, err)
			}
		}
		got, cut := tl.text()
		if got != tc.want || cut != tc.cut {
			t.Errorf("%s: got %q (cut %v), want %q (cut %v)", tc.name, got, cut, tc.want, tc.cut)
		}
		if cap(tl.buf) != 8 {
			t.Errorf("%s: buffer grew to %d", tc.name, cap(tl.buf))
		}
	}
}

func TestTailBoundedUnderLoad(t *testing.T) {
	tl := newTail(outputMax)
	chunk := strings.Repeat("y", 32<<10)
	for range 64 {
		tl.Write([]byte(chunk))
	}
	tl.Write([]byte("end"))
	got, cut := tl.text()
	if len(got) != outputMax || !cut || !strings.HasSuffix(got, "yend") {
		t.Fatalf("kept %d bytes (cut %v) ending %q", len(got), cut, got[len(got)-8:])
	}
}
