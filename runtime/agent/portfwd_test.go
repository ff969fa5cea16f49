package agent

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/api"
)

// echoServer listens on addr (127.0.0.1:0 or [::1]:0) and, for each
// connection, says hello and echoes what it reads until EOF, then
// closes. It returns the port.
func echoServer(t *testing.T, network, addr string) uint16 {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.WriteString(c, "hello\n")
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func TestDialPort(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		h := newHarness(t)
		addr, network := "127.0.0.1:0", "tcp4"
		if v6 {
			addr, network = "[::1]:0", "tcp6"
		}
		port := echoServer(t, network, addr)
		ctx := testCtx(t, 10*time.Second)
		c, err := h.client.DialPort(ctx, "port-1", port, v6)
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		r := bufio.NewReader(c)
		if line, err := r.ReadString('\n'); err != nil || line != "hello\n" {
			t.Fatalf("%s: read %q, %v", addr, line, err)
		}
		if _, err := io.WriteString(c, "ping"); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(r, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("%s: echo %q, %v", addr, buf, err)
		}
		// Close half-closes: the server sees EOF, closes, and that
		// comes back as the stream's EOF.
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
			t.Fatalf("%s: after close read %q, %v; want EOF", addr, rest, err)
		}
	}
}

func TestDialPortNothingListens(t *testing.T) {
	h := newHarness(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	ctx := testCtx(t, 10*time.Second)
	if _, err := h.client.DialPort(ctx, "port-1", port, false); !errdefs.IsNotFound(err) {
		t.Fatalf("dial a closed port: %v, want not found", err)
	}
	// The session is fine, and the id can be used again.
	port = echoServer(t, "tcp4", "127.0.0.1:0")
	c, err := h.client.DialPort(ctx, "port-1", port, false)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestDialPortRefusesBadRequests(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	if _, err := h.client.DialPort(ctx, "port-1", 0, false); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("port 0: %v", err)
	}
	if _, err := h.client.DialPort(ctx, "bad/id", 80, false); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad id: %v", err)
	}
	// What the host client does not send, the guest refuses too.
	for _, port := range []uint32{0, 65536, 1 << 31} {
		_, err := h.client.agent.DialPort(ctx, &api.DialPortRequest{Port: port, StreamId: "p1"})
		if err = h.client.mapErr("dial", err); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("guest, port %d: %v, want invalid argument", port, err)
		}
	}
	// A call without its stream waits for it, then fails.
	began := time.Now()
	_, err := h.client.agent.DialPort(ctx, &api.DialPortRequest{Port: 80, StreamId: "nostream"})
	if err = h.client.mapErr("dial", err); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("no stream: %v, want failed precondition", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("no stream: failed after %v", took)
	}
}

func TestDialPortSessionEnd(t *testing.T) {
	h := newHarness(t)
	port := echoServer(t, "tcp4", "127.0.0.1:0")
	ctx := testCtx(t, 10*time.Second)
	c, err := h.client.DialPort(ctx, "port-1", port, false)
	if err != nil {
		t.Fatal(err)
	}
	h.client.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadAll(c)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("read after the session ended: %v", err)
	}
	if _, err := h.client.DialPort(ctx, "port-2", port, false); !errdefs.IsUnavailable(err) {
		t.Fatalf("dial after the session ended: %v, want unavailable", err)
	}
}
