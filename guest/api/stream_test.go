package api

import (
	"bytes"
	"errors"
	"testing"
)

func TestStreamHeaderRoundTrip(t *testing.T) {
	for _, h := range []StreamHeader{
		{Kind: StreamControl},
		{Kind: StreamStdin, ID: "exec-1"},
		{Kind: StreamStdout, ID: "a.b_c-D"},
		{Kind: StreamStderr, ID: string(bytes.Repeat([]byte("x"), MaxIDLen))},
		{Kind: StreamLayer, ID: "p17"},
		{Kind: StreamPort, ID: "p18"},
	} {
		var buf bytes.Buffer
		if err := WriteStreamHeader(&buf, h); err != nil {
			t.Fatalf("write %+v: %v", h, err)
		}
		buf.WriteString("payload")
		got, err := ReadStreamHeader(&buf)
		if err != nil || got != h {
			t.Fatalf("read back %+v, %v; want %+v", got, err, h)
		}
		if buf.String() != "payload" {
			t.Fatalf("header read consumed payload: %q left", buf.String())
		}
	}
}

func TestStreamHeaderRejects(t *testing.T) {
	for _, h := range []StreamHeader{
		{Kind: StreamControl, ID: "x"},
		{Kind: StreamStdout},
		{Kind: StreamStdin, ID: "bad/id"},
		{Kind: StreamPort},
		{Kind: 9, ID: "x"},
	} {
		if err := WriteStreamHeader(&bytes.Buffer{}, h); err == nil {
			t.Errorf("write %+v succeeded", h)
		}
	}
	for name, raw := range map[string]string{
		"short":     "CCN",
		"magic":     "XXXX\x01\x00",
		"kind":      "CCN1\x07\x00",
		"long id":   "CCN1\x03\x41" + string(bytes.Repeat([]byte("a"), 65)),
		"truncated": "CCN1\x03\x05ab",
		"bad chars": "CCN1\x03\x02a/",
	} {
		if _, err := ReadStreamHeader(bytes.NewReader([]byte(raw))); !errors.Is(err, ErrBadHeader) {
			t.Errorf("%s: err = %v, want ErrBadHeader", name, err)
		}
	}
}

// FuzzReadStreamHeader: whatever the peer sends, reading a header never
// panics, never reads past the longest header, and reads nothing past the
// header it accepts; anything accepted writes back to the same bytes. The
// seed corpus is in testdata/fuzz/FuzzReadStreamHeader.
func FuzzReadStreamHeader(f *testing.F) {
	f.Add([]byte("CCN1\x01\x00"))
	f.Add([]byte("CCN1\x03\x03abc"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		h, err := ReadStreamHeader(r)
		read := len(b) - r.Len()
		if read > len(headerMagic)+2+MaxIDLen {
			t.Fatalf("read %d bytes, more than the longest header", read)
		}
		if err != nil {
			if !errors.Is(err, ErrBadHeader) {
				t.Fatalf("error %v is not ErrBadHeader", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := WriteStreamHeader(&buf, h); err != nil {
			t.Fatalf("accepted %+v but cannot write it: %v", h, err)
		}
		if !bytes.Equal(b[:read], buf.Bytes()) {
			t.Fatalf("re-encoded %q is not the %q read", buf.Bytes(), b[:read])
		}
	})
}
