package api

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/guest/api/conntest"
)

// pipe returns the two ends of a net.Pipe, closed when the test ends.
func pipe(t testing.TB) (net.Conn, net.Conn) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// byteConn delivers one byte per Read.
type byteConn struct{ net.Conn }

func (c byteConn) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return c.Conn.Read(p)
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// handshake runs both sides on host and guest, the guest's after
// guestAfter, and returns their conns.
func handshake(t *testing.T, host, guest net.Conn, guestAfter time.Duration) (net.Conn, net.Conn) {
	t.Helper()
	type result struct {
		conn net.Conn
		err  error
	}
	guestSide := make(chan result, 1)
	go func() {
		time.Sleep(guestAfter)
		c, err := GuestHandshake(testCtx(t, 10*time.Second), guest)
		guestSide <- result{c, err}
	}()
	h, err := HostHandshake(testCtx(t, 10*time.Second), host)
	if err != nil {
		t.Fatalf("host: %v", err)
	}
	g := <-guestSide
	if g.err != nil {
		t.Fatalf("guest: %v", g.err)
	}
	return h, g.conn
}

// exchange checks that what one side writes after the handshake is
// exactly what the other reads, both ways: no frame of the handshake is
// left in either direction.
func exchange(t *testing.T, host, guest net.Conn) {
	t.Helper()
	check := func(from, to net.Conn, msg string) {
		t.Helper()
		errc := make(chan error, 1)
		go func() {
			_, err := from.Write([]byte(msg))
			errc <- err
		}()
		got := make([]byte, len(msg))
		_ = to.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(to, got); err != nil {
			t.Fatalf("read %q: %v", msg, err)
		}
		_ = to.SetReadDeadline(time.Time{})
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if string(got) != msg {
			t.Fatalf("read %q, want %q", got, msg)
		}
	}
	check(host, guest, "from the host")
	check(guest, host, "from the guest")
}

func TestHandshake(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conns func(testing.TB) (net.Conn, net.Conn)
	}{
		{"pipe", pipe},
		{"socketpair", conntest.SocketPair},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, guest := tc.conns(t)
			exchange(t, host, guest)
			h, g := handshake(t, host, guest, 0)
			exchange(t, h, g)
		})
	}
}

// TestHandshakeAfterCancel: the handshake's context does not reach the
// session after it (the deadlines it set are gone).
func TestHandshakeAfterCancel(t *testing.T) {
	host, guest := conntest.SocketPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := GuestHandshake(ctx, guest)
		done <- err
	}()
	h, err := HostHandshake(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cancel()
	time.Sleep(10 * time.Millisecond)
	exchange(t, h, guest)
}

// TestHandshakeOneByteReads: both ends find their frames when every
// Read returns a single byte.
func TestHandshakeOneByteReads(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conns func(testing.TB) (net.Conn, net.Conn)
	}{
		{"pipe", pipe},
		{"socketpair", conntest.SocketPair},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, guest := tc.conns(t)
			h, g := handshake(t, byteConn{host}, byteConn{guest}, 0)
			exchange(t, h, g)
		})
	}
}

// TestHandshakeQueuedHellos: a guest that starts late (a booting one, on
// virtio-serial) finds several HELLOs waiting; it answers once, and
// nothing of them reaches the session.
func TestHandshakeQueuedHellos(t *testing.T) {
	host, guest := conntest.SocketPair(t)
	h, g := handshake(t, host, guest, 10*helloInterval)
	exchange(t, h, g)

	// The same, seen from the guest: it takes the queued HELLOs and
	// writes a single WELCOME.
	host, guest = conntest.SocketPair(t)
	n := nonce{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	hello := frameOf(helloMagic, n)
	for range 5 {
		if _, err := host.Write(hello[:]); err != nil {
			t.Fatal(err)
		}
	}
	start := frameOf(startMagic, n)
	if _, err := host.Write(append(start[:], "session"...)); err != nil {
		t.Fatal(err)
	}
	g, err := GuestHandshake(testCtx(t, 5*time.Second), guest)
	if err != nil {
		t.Fatal(err)
	}
	guest.Close()
	welcome := frameOf(welcomeMagic, n)
	if got, _ := io.ReadAll(host); !bytes.Equal(got, welcome[:]) {
		t.Fatalf("guest wrote %q, want one WELCOME", got)
	}
	if got, _ := io.ReadAll(g); string(got) != "session" {
		t.Fatalf("session got %q", got)
	}
}

// TestHandshakeLeftover: bytes read past the end of the handshake are
// the session's, on both ends.
func TestHandshakeLeftover(t *testing.T) {
	t.Run("guest", func(t *testing.T) {
		host, guest := pipe(t)
		n := nonce{0xaa, 0xbb}
		go func() {
			// A host that sends START and its first frames in one
			// write.
			hello := frameOf(helloMagic, n)
			host.Write(hello[:])
			io.ReadFull(host, make([]byte, frameLen))
			start := frameOf(startMagic, n)
			host.Write(append(start[:], "yamux frames"...))
		}()
		g, err := GuestHandshake(testCtx(t, 5*time.Second), guest)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := g.(*leftoverConn); !ok {
			t.Fatalf("guest conn is %T: nothing was read past START", g)
		}
		got := make([]byte, len("yamux frames"))
		if _, err := io.ReadFull(g, got); err != nil || string(got) != "yamux frames" {
			t.Fatalf("session read %q, %v", got, err)
		}
	})
	t.Run("host", func(t *testing.T) {
		host, guest := pipe(t)
		go func() {
			// A guest that answers and goes on at once.
			b := make([]byte, frameLen)
			io.ReadFull(guest, b)
			var n nonce
			copy(n[:], b[magicLen:])
			welcome := frameOf(welcomeMagic, n)
			guest.Write(append(welcome[:], "more"...))
			io.Copy(io.Discard, guest)
		}()
		h, err := HostHandshake(testCtx(t, 5*time.Second), host)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(h, got); err != nil || string(got) != "more" {
			t.Fatalf("session read %q, %v", got, err)
		}
	})
}

// TestHostDiscardsStaleFrames: what the guest sends before its WELCOME
// (a stale session's frames, a WELCOME of another nonce, a partial
// WELCOME) is discarded; a WELCOME that follows a partial one is found.
func TestHostDiscardsStaleFrames(t *testing.T) {
	host, guest := pipe(t)
	errc := make(chan error, 1)
	go func() {
		b := make([]byte, frameLen)
		if _, err := io.ReadFull(guest, b); err != nil {
			errc <- err
			return
		}
		var n nonce
		copy(n[:], b[magicLen:])
		other := n
		other[0] ^= 0xff
		stale := frameOf(welcomeMagic, other)
		welcome := frameOf(welcomeMagic, n)
		var out []byte
		out = append(out, "\x00\x00\x00\x01\x00\x00\x00\x03\x00\x00\x00\x05hello"...) // a yamux data frame
		out = append(out, stale[:]...)
		out = append(out, welcome[:frameLen-1]...)
		out = append(out, welcome[:]...)
		if _, err := guest.Write(out); err != nil {
			errc <- err
			return
		}
		// The START, after any HELLO.
		for {
			if _, err := io.ReadFull(guest, b); err != nil {
				errc <- err
				return
			}
			if string(b[:magicLen]) == startMagic {
				errc <- nil
				return
			}
		}
	}()
	if _, err := HostHandshake(testCtx(t, 5*time.Second), host); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestHostRefusesWrongNonce: a guest that answers with another nonce, or
// echoes the HELLO, is not taken for an answer, and gets no START.
func TestHostRefusesWrongNonce(t *testing.T) {
	for _, name := range []string{"wrong nonce", "echo"} {
		t.Run(name, func(t *testing.T) {
			host, guest := pipe(t)
			sawStart := make(chan bool, 1)
			go func() {
				b := make([]byte, frameLen)
				answered, started := false, false
				for {
					if _, err := io.ReadFull(guest, b); err != nil {
						sawStart <- started
						return
					}
					started = started || string(b[:magicLen]) == startMagic
					if answered {
						continue
					}
					answered = true
					reply := append([]byte(nil), b...)
					if name == "wrong nonce" {
						copy(reply, welcomeMagic)
						reply[frameLen-1]++
					}
					go guest.Write(reply)
				}
			}()
			_, err := HostHandshake(testCtx(t, 300*time.Millisecond), host)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("host: %v, want the deadline", err)
			}
			host.Close()
			if <-sawStart {
				t.Fatal("the host sent START")
			}
		})
	}
}

// TestHostDiscardBound: a guest that sends more than the host discards
// fails the handshake, saying so, well before the deadline.
func TestHostDiscardBound(t *testing.T) {
	host, guest := conntest.SocketPair(t)
	go func() {
		junk := bytes.Repeat([]byte{0x89, 'C', 'C', 'N'}, 16<<10)
		for {
			if _, err := guest.Write(junk); err != nil {
				return
			}
		}
	}()
	go io.Copy(io.Discard, guest)
	start := time.Now()
	_, err := HostHandshake(testCtx(t, 30*time.Second), host)
	if !errors.Is(err, ErrHandshakeOverrun) || !strings.Contains(err.Error(), "bytes") {
		t.Fatalf("host: %v, want overrun", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("overrun found after %v", d)
	}
	t.Log(err)
}

// TestHandshakeEOF: either end fails at once when the other closes.
func TestHandshakeEOF(t *testing.T) {
	host, guest := conntest.SocketPair(t)
	guest.Close()
	if _, err := HostHandshake(testCtx(t, 5*time.Second), host); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("host on a closed channel: %v", err)
	}
	host, guest = conntest.SocketPair(t)
	host.Close()
	if _, err := GuestHandshake(testCtx(t, 5*time.Second), guest); !errors.Is(err, io.EOF) {
		t.Fatalf("guest on a closed channel: %v, want EOF", err)
	}
}

// TestHandshakeContext: a deadline or a cancel ends either side
// promptly, blocked in a Read or (net.Pipe, no reader) in a Write.
func TestHandshakeContext(t *testing.T) {
	const limit = 2 * time.Second
	for _, tc := range []struct {
		name  string
		conns func(testing.TB) (net.Conn, net.Conn)
	}{
		{"pipe", pipe},
		{"socketpair", conntest.SocketPair},
	} {
		for _, side := range []string{"host", "guest"} {
			for _, how := range []string{"deadline", "cancel"} {
				t.Run(tc.name+"/"+side+"/"+how, func(t *testing.T) {
					host, guest := tc.conns(t)
					ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
					want := context.DeadlineExceeded
					if how == "cancel" {
						cancel()
						ctx, cancel = context.WithCancel(context.Background())
						time.AfterFunc(100*time.Millisecond, cancel)
						want = context.Canceled
					}
					defer cancel()
					start := time.Now()
					var err error
					if side == "host" {
						_, err = HostHandshake(ctx, host)
					} else {
						_, err = GuestHandshake(ctx, guest)
					}
					if !errors.Is(err, want) {
						t.Fatalf("%v, want %v", err, want)
					}
					if d := time.Since(start); d > limit {
						t.Fatalf("returned after %v", d)
					}
				})
			}
		}
	}
}

// TestGuestFollowsNewHost: a HELLO of another nonce (a host that replaced
// one that died mid-handshake) is answered too, and only its START ends
// the handshake.
func TestGuestFollowsNewHost(t *testing.T) {
	host, guest := conntest.SocketPair(t)
	a, b := nonce{1}, nonce{2}
	var in []byte
	for _, f := range [][frameLen]byte{frameOf(helloMagic, a), frameOf(helloMagic, b), frameOf(helloMagic, b), frameOf(startMagic, a)} {
		in = append(in, f[:]...)
	}
	if _, err := host.Write(append(in, "after A's START"...)); err != nil {
		t.Fatal(err)
	}
	done := make(chan net.Conn, 1)
	go func() {
		g, err := GuestHandshake(testCtx(t, 5*time.Second), guest)
		if err != nil {
			t.Error(err)
		}
		done <- g
	}()
	wa, wb := frameOf(welcomeMagic, a), frameOf(welcomeMagic, b)
	got := make([]byte, 2*frameLen)
	if _, err := io.ReadFull(host, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, append(wa[:], wb[:]...)) {
		t.Fatalf("guest answered %q", got)
	}
	select {
	case <-done:
		t.Fatal("A's START ended the handshake that B's HELLO took over")
	case <-time.After(100 * time.Millisecond):
	}
	sb := frameOf(startMagic, b)
	if _, err := host.Write(append(sb[:], "B's session"...)); err != nil {
		t.Fatal(err)
	}
	g := <-done
	if g == nil {
		return
	}
	r := make([]byte, len("B's session"))
	if _, err := io.ReadFull(g, r); err != nil || string(r) != "B's session" {
		t.Fatalf("session read %q, %v", r, err)
	}
}

func TestMatcher(t *testing.T) {
	for _, tc := range []struct {
		pat, in string
		want    []int // where matches end
	}{
		{"aab", "aaab", []int{3}},
		{"abab", "abababab", []int{3, 7}},
		{"abcabd", "abcabcabd", []int{8}},
		{"aaaa", "aaaaaaaaa", []int{3, 7}},
		{helloMagic, "\x89CC\x89CCNHELO", []int{10}},
	} {
		var m matcher
		m.reset([]byte(tc.pat))
		var got []int
		for i := range len(tc.in) {
			if m.feed(tc.in[i]) {
				got = append(got, i)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q in %q: matches end at %v, want %v", tc.pat, tc.in, got, tc.want)
		}
	}
}

// TestFramesHaveNoZero: no byte of a magic is 0, yamux's version, and
// neither is a host's nonce.
func TestFramesHaveNoZero(t *testing.T) {
	for _, m := range []string{helloMagic, welcomeMagic, startMagic} {
		if len(m) != magicLen || strings.IndexByte(m, 0) >= 0 {
			t.Errorf("magic %q", m)
		}
	}
	host, guest := pipe(t)
	go HostHandshake(testCtx(t, time.Second), host)
	for range 50 {
		b := make([]byte, frameLen)
		if _, err := io.ReadFull(guest, b); err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(b, 0) >= 0 {
			t.Fatalf("HELLO %x holds a 0", b)
		}
		// A new host, a new nonce.
		host.Close()
		host, guest = pipe(t)
		go HostHandshake(testCtx(t, time.Second), host)
	}
}
