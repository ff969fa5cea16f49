package api

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// scriptConn is a guest's end of the channel that reads a fixed stream,
// in reads whose sizes cycle through chunks, then EOF, and records what is
// written to it.
type scriptConn struct {
	net.Conn // nil: only the methods below are called
	in       []byte
	chunks   []byte
	reads    int
	out      bytes.Buffer
}

func (c *scriptConn) Read(p []byte) (int, error) {
	if len(c.in) == 0 {
		return 0, io.EOF
	}
	n := len(c.in)
	if len(c.chunks) > 0 {
		n = int(c.chunks[c.reads%len(c.chunks)]) + 1
	}
	c.reads++
	n = min(n, len(p), len(c.in))
	copy(p, c.in[:n])
	c.in = c.in[n:]
	return n, nil
}

func (c *scriptConn) Write(p []byte) (int, error)      { return c.out.Write(p) }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }
func (c *scriptConn) Close() error                     { return nil }

// guestReference is what the guest's handshake must do with stream,
// written plainly: the WELCOMEs it writes, whether it ends with a START,
// and the session's bytes after it.
func guestReference(stream []byte) (welcomes []byte, ok bool, rest []byte) {
	var answered bool
	var n nonce
	from := 0 // no frame is looked for across a nonce
	for i := 0; i < len(stream); i++ {
		if answered && i+1-from >= frameLen {
			start := frameOf(startMagic, n)
			if bytes.Equal(stream[i+1-frameLen:i+1], start[:]) {
				return welcomes, true, stream[i+1:]
			}
		}
		if i+1-from >= magicLen && string(stream[i+1-magicLen:i+1]) == helloMagic {
			if i+nonceLen >= len(stream) {
				return welcomes, false, nil
			}
			var got nonce
			copy(got[:], stream[i+1:])
			if !answered || got != n {
				n, answered = got, true
				w := frameOf(welcomeMagic, n)
				welcomes = append(welcomes, w[:]...)
			}
			i += nonceLen
			from = i + 1
		}
	}
	return welcomes, false, nil
}

// FuzzGuestHandshake feeds the guest's handshake any stream from the
// host, in reads of any sizes: it answers and ends exactly as the plain
// reference does, and hands the session every byte after the START.
func FuzzGuestHandshake(f *testing.F) {
	n := nonce{0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x01}
	hello, start := frameOf(helloMagic, n), frameOf(startMagic, n)
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	f.Add(cat(hello[:], start[:], []byte("\x00\x01\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00")), []byte{})
	f.Add(cat(hello[:], hello[:], hello[:], start[:], []byte("session")), []byte{0})
	f.Add(cat([]byte("\x00\x00\x00\x02stale"), hello[:5], hello[:], start[:frameLen-1], start[:]), []byte{2, 7, 0, 30})
	other := frameOf(helloMagic, nonce{1})
	f.Add(cat(hello[:], other[:], start[:], hello[:]), []byte{3})
	f.Add([]byte(helloMagic+helloMagic), []byte{})
	f.Fuzz(func(t *testing.T, stream, chunks []byte) {
		c := &scriptConn{in: stream, chunks: chunks}
		conn, err := GuestHandshake(context.Background(), c)
		welcomes, ok, rest := guestReference(stream)
		if !bytes.Equal(c.out.Bytes(), welcomes) {
			t.Fatalf("wrote %x, want %x", c.out.Bytes(), welcomes)
		}
		if (err == nil) != ok {
			t.Fatalf("handshake: %v, reference ok %v", err, ok)
		}
		if !ok {
			return
		}
		got, _ := io.ReadAll(conn)
		if !bytes.Equal(got, rest) {
			t.Fatalf("session read %q, want %q", got, rest)
		}
	})
}
