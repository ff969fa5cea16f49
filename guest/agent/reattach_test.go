//go:build linux

package agent

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/cocoonrt/cocoon/guest/api"
	"github.com/cocoonrt/cocoon/guest/api/conntest"
)

// resetAfterClose is how soon the host of a yamuxPair resets a stream it
// closed and the guest did not: a host that dropped a stream makes the
// guest's writes to it fail, while the session lives on.
const resetAfterClose = 50 * time.Millisecond

// yamuxPair returns the host's and the guest's ends of a yamux session
// over a socket pair; no agent serves it.
func yamuxPair(t *testing.T) (host, guest *yamux.Session) {
	t.Helper()
	h, g := conntest.SocketPair(t)
	conns := [2]net.Conn{h, g}
	hcfg := yamux.DefaultConfig()
	hcfg.EnableKeepAlive = false
	hcfg.StreamCloseTimeout = resetAfterClose
	hcfg.LogOutput = io.Discard
	var err error
	host, err = yamux.Client(conns[0], hcfg)
	if err != nil {
		t.Fatal(err)
	}
	guest, err = yamux.Server(conns[1], yamuxConfig(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		host.Close()
		guest.Close()
	})
	return host, guest
}

// openStreamPair opens a stream of the session: the host's end and the
// guest's.
func openStreamPair(t *testing.T, host, guest *yamux.Session) (net.Conn, net.Conn) {
	t.Helper()
	hs, err := host.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	gs, err := guest.AcceptStream()
	if err != nil {
		t.Fatal(err)
	}
	return hs, gs
}

// endSession ends the session from the host's side and waits until the
// guest has seen it end. It lets the guest's writes of what the host read
// return first: yamux cannot tell whether a write still waiting for its
// answer when the session ends was sent, and the agent takes it for
// unsent (at least once).
func endSession(t *testing.T, host, guest *yamux.Session) {
	t.Helper()
	time.Sleep(100 * time.Millisecond)
	host.Close()
	select {
	case <-guest.CloseChan():
	case <-time.After(10 * time.Second):
		t.Fatal("the guest did not see its session end")
	}
}

// detachedStdio is the stdio of a pretend process whose stdout (and, with
// stdin, stdin) are the guest's ends in streams: the test writes the
// process's output to out and reads its input from in.
func detachedStdio(t *testing.T, streams streamSet, times stdioTimes) (pio *stdio, in, out *os.File) {
	t.Helper()
	req := &api.StartProcessRequest{Id: "p", Stdin: streams[api.StreamStdin] != nil, Stdout: streams[api.StreamStdout] != nil}
	pio, err := newStdio(req, streams, times)
	if err != nil {
		t.Fatal(err)
	}
	in, out = pio.child[0], pio.child[1]
	pio.child = [3]*os.File{}
	t.Cleanup(func() {
		in.Close()
		out.Close()
		pio.release()
	})
	pio.start(context.Background())
	return pio, in, out
}

// readAll reads c to EOF within 10 s.
func readAll(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read the host's stream: %v", err)
	}
	return string(b)
}

func readN(t *testing.T, c net.Conn, n int) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read the host's stream: %v", err)
	}
	return string(b)
}

// exitedWithin runs processExited and reports whether it returned
// within d; it keeps running after if not, and done tells when it has.
func exitedWithin(pio *stdio, d time.Duration) (bool, <-chan struct{}) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		pio.processExited()
	}()
	select {
	case <-done:
		return true, done
	case <-time.After(d):
		return false, done
	}
}

// TestStdioHeldForReattach: output that could not go to a stream whose
// session ended waits, past the drain idle and with the exit held back,
// for the stream AttachProcess brings, and goes there first.
func TestStdioHeldForReattach(t *testing.T) {
	host1, guest1 := yamuxPair(t)
	hs1, gs1 := openStreamPair(t, host1, guest1)
	pio, _, out := detachedStdio(t, streamSet{api.StreamStdout: gs1}, stdioTimes{drainIdle: 50 * time.Millisecond, reattachTimeout: time.Minute})
	if _, err := out.Write([]byte("one")); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, hs1, 3); got != "one" {
		t.Fatalf("first session got %q", got)
	}
	endSession(t, host1, guest1)
	if _, err := out.Write([]byte("two")); err != nil {
		t.Fatal(err)
	}
	out.Close() // the process exits
	exited, done := exitedWithin(pio, 300*time.Millisecond)
	if exited {
		t.Fatal("the exit was reported while its output waited for a stream")
	}

	host2, guest2 := yamuxPair(t)
	hs2, gs2 := openStreamPair(t, host2, guest2)
	if err := pio.attach(streamSet{api.StreamStdout: gs2}); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, hs2); got != "two" {
		t.Fatalf("reattached stream got %q", got)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the exit was not reported after the output went out")
	}
}

// TestStdioHostClosedStreamDiscards: a stream the host dropped in a
// session that goes on is discarded at once, as it always was: the
// process never blocks and its exit is not held back.
func TestStdioHostClosedStreamDiscards(t *testing.T) {
	host, guest := yamuxPair(t)
	hs, gs := openStreamPair(t, host, guest)
	pio, _, out := detachedStdio(t, streamSet{api.StreamStdout: gs}, stdioTimes{drainIdle: 50 * time.Millisecond, reattachTimeout: time.Minute})
	if _, err := out.Write([]byte("one")); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, hs, 3); got != "one" {
		t.Fatalf("got %q", got)
	}
	hs.Close()
	time.Sleep(4 * resetAfterClose) // the host resets the stream
	// Several pipes' and stream windows' worth: it all goes, without a
	// reader.
	written := make(chan error, 1)
	go func() {
		_, err := out.Write(bytes.Repeat([]byte("x"), 4<<20))
		out.Close()
		written <- err
	}()
	select {
	case err := <-written:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the process blocked on the output of a stream its host dropped")
	}
	if exited, _ := exitedWithin(pio, 5*time.Second); !exited {
		t.Fatal("the exit was held back")
	}
	select {
	case <-guest.CloseChan():
		t.Fatal("the session ended")
	default:
	}
}

// TestStdioCloseStdinWhileDetached: CloseStdin ends the wait of a stdin
// whose session ended: the process reads EOF at once.
func TestStdioCloseStdinWhileDetached(t *testing.T) {
	host, guest := yamuxPair(t)
	hin, gin := openStreamPair(t, host, guest)
	_, gout := openStreamPair(t, host, guest)
	pio, in, _ := detachedStdio(t, streamSet{api.StreamStdin: gin, api.StreamStdout: gout}, stdioTimes{drainIdle: 50 * time.Millisecond, reattachTimeout: time.Minute})
	if _, err := hin.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 3)
	if _, err := io.ReadFull(in, b); err != nil || string(b) != "abc" {
		t.Fatalf("stdin got %q, %v", b, err)
	}
	endSession(t, host, guest)
	time.Sleep(100 * time.Millisecond) // the copier waits for a stream
	if err := pio.closeStdin(); err != nil {
		t.Fatal(err)
	}
	_ = in.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := in.Read(b); err != io.EOF {
		t.Fatalf("stdin after CloseStdin: %d bytes, %v; want EOF", n, err)
	}
}

// TestStdioAttachAfterFallback: a stream that gave up waiting discards
// output, and a later AttachProcess still takes what follows.
func TestStdioAttachAfterFallback(t *testing.T) {
	host1, guest1 := yamuxPair(t)
	_, gs1 := openStreamPair(t, host1, guest1)
	pio, _, out := detachedStdio(t, streamSet{api.StreamStdout: gs1}, stdioTimes{drainIdle: 50 * time.Millisecond, reattachTimeout: 100 * time.Millisecond})
	endSession(t, host1, guest1)
	if _, err := out.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // past the reattach timeout

	host2, guest2 := yamuxPair(t)
	hs2, gs2 := openStreamPair(t, host2, guest2)
	if err := pio.attach(streamSet{api.StreamStdout: gs2}); err != nil {
		t.Fatal(err)
	}
	if _, err := out.Write([]byte("kept")); err != nil {
		t.Fatal(err)
	}
	out.Close()
	if got := readAll(t, hs2); got != "kept" {
		t.Fatalf("reattached stream got %q", got)
	}
}
