package api

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// tcpPair returns the two ends of a TCP connection on 127.0.0.1.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *net.TCPConn, 1)
	go func() {
		c, _ := ln.AcceptTCP()
		accepted <- c
	}()
	d, err := net.DialTCP("tcp4", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	a := <-accepted
	if a == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { d.Close(); a.Close() })
	return d, a
}

// streamPair returns the two ends of a stream of a yamux session, as the
// host's and the guest's ends of a port stream.
func streamPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	hc, gc := tcpPair(t)
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	host, err := yamux.Client(hc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	guest, err := yamux.Server(gc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close(); guest.Close() })
	hs, err := host.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	// A stream reaches its peer with its first frame.
	if _, err := hs.Write([]byte{0}); err != nil {
		t.Fatal(err)
	}
	gs, err := guest.AcceptStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(gs, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	return hs, gs
}

// spliced is a client connected through a Splice of a TCP connection and
// a stream to a server end: client -> (a | Splice | b) -> server.
type spliced struct {
	client, server net.Conn
	done           chan error
	aToB, bToA     int64
}

func newSpliced(t *testing.T, idle time.Duration) *spliced {
	t.Helper()
	client, a := tcpPair(t)
	b, server := streamPair(t)
	s := &spliced{client: client, server: server, done: make(chan error, 1)}
	go func() {
		var err error
		s.aToB, s.bToA, err = Splice(a, b, idle)
		s.done <- err
	}()
	return s
}

func (s *spliced) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-s.done:
		return err
	case <-time.After(within):
		t.Fatalf("the splice did not end within %v", within)
		return nil
	}
}

func TestSpliceBothWaysWithHalfClose(t *testing.T) {
	s := newSpliced(t, 5*time.Second)
	payload := bytes.Repeat([]byte("cocoon "), 200<<10) // more than a window
	go func() {
		_, _ = s.client.Write(payload)
		_ = s.client.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(s.server)
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("server read %d bytes, %v; want %d", len(got), err, len(payload))
	}
	// The client's half-close reached the server as EOF; the other way
	// still works.
	if _, err := s.server.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	_ = s.server.Close()
	reply, err := io.ReadAll(s.client)
	if err != nil || string(reply) != "hello" {
		t.Fatalf("client read %q, %v", reply, err)
	}
	if err := s.wait(t, 5*time.Second); err != nil {
		t.Fatalf("splice: %v", err)
	}
	if s.aToB != int64(len(payload)) || s.bToA != 5 {
		t.Fatalf("copied %d and %d bytes, want %d and 5", s.aToB, s.bToA, len(payload))
	}
}

func TestSpliceIdleAfterHalfClose(t *testing.T) {
	s := newSpliced(t, 200*time.Millisecond)
	_ = s.client.(*net.TCPConn).CloseWrite()
	if _, err := io.ReadAll(s.server); err != nil {
		t.Fatal(err)
	}
	// The server neither writes nor closes: the splice gives up once the
	// idle time has passed without progress.
	began := time.Now()
	err := s.wait(t, 5*time.Second)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("splice: %v, want a timeout", err)
	}
	if took := time.Since(began); took > 3*time.Second {
		t.Fatalf("ended after %v", took)
	}
	_ = s.client.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := s.client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("client read after the splice: %v, want EOF", err)
	}
}

func TestSpliceKeepsAnIdleOpenConnection(t *testing.T) {
	s := newSpliced(t, 100*time.Millisecond)
	// Neither side has closed: idle does not apply.
	time.Sleep(400 * time.Millisecond)
	if _, err := s.client.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(s.server, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("server read %q, %v", buf, err)
	}
	_ = s.client.Close()
	_ = s.server.Close()
	if err := s.wait(t, 5*time.Second); err != nil {
		t.Fatalf("splice: %v", err)
	}
}

func TestSpliceErrorEndsBoth(t *testing.T) {
	s := newSpliced(t, time.Minute)
	// A reset of the client ends the splice at once, though the server
	// keeps its stream open.
	_ = s.client.(*net.TCPConn).SetLinger(0)
	_ = s.client.Close()
	if err := s.wait(t, 5*time.Second); err == nil {
		t.Fatal("splice ended without an error after a reset")
	}
	_ = s.server.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := s.server.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("server read after the reset: %v, want EOF", err)
	}
}
