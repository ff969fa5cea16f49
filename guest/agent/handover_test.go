//go:build linux

package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/hashicorp/yamux"

	"github.com/cocoonrt/cocoon/guest/api"
	"github.com/cocoonrt/cocoon/guest/api/conntest"
)

// portOpening is one opening of a port whose byte stream outlives it, as
// /dev/vportNpM's does: Close ends this opening's reads, blocked or
// later, but not the stream, which the next opening reads on.
type portOpening struct {
	net.Conn
	closed atomic.Bool
}

func (p *portOpening) Read(b []byte) (int, error) {
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	return p.Conn.Read(b)
}

func (p *portOpening) Close() error {
	if p.closed.CompareAndSwap(false, true) {
		_ = p.Conn.SetReadDeadline(time.Unix(1, 0))
	}
	return nil
}

// reopen returns a fresh opening of stream. The previous one's reader is
// gone by then: Serve returns only after its yamux session's receive loop
// has, or after its handshake's last read.
func reopen(stream net.Conn) *portOpening {
	_ = stream.SetDeadline(time.Time{})
	return &portOpening{Conn: stream}
}

// hostSession is a host's agent session, made as runtime/agent's Connect
// makes it: the handshake, a yamux client, the ttrpc control stream.
type hostSession struct {
	sess  *yamux.Session
	agent api.AgentService
}

func connectHost(t *testing.T, ctx context.Context, conn net.Conn) *hostSession {
	t.Helper()
	taken, err := api.HostHandshake(ctx, conn)
	if err != nil {
		t.Fatalf("host handshake: %v", err)
	}
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.LogOutput = io.Discard
	sess, err := yamux.Client(taken, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := api.WriteStreamHeader(st, api.StreamHeader{Kind: api.StreamControl}); err != nil {
		t.Fatal(err)
	}
	rpc := ttrpc.NewClient(st)
	t.Cleanup(func() { rpc.Close(); sess.Close() })
	return &hostSession{sess: sess, agent: api.NewAgentClient(rpc)}
}

func (h *hostSession) ping(ctx context.Context) error {
	_, err := h.agent.Ping(ctx, &api.PingRequest{})
	return err
}

// TestHandoverFromStaleSession is a restore from a snapshot: the guest is
// inside a session whose host is gone and has not been told (no EOF), a
// new host connects on the same byte stream, and its first session is
// answered. The stale session fails on the first HELLO, the agent opens
// its port again, as ServeSerial does, and the next session's handshake
// takes a later HELLO.
func TestHandoverFromStaleSession(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conns func(t *testing.T) (net.Conn, net.Conn)
	}{
		{"pipe", func(t *testing.T) (net.Conn, net.Conn) { return net.Pipe() }},
		{"socketpair", func(t *testing.T) (net.Conn, net.Conn) { return conntest.SocketPair(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hostEnd, guestEnd := tc.conns(t)
			defer hostEnd.Close()
			defer guestEnd.Close()
			s := newService(t, Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var openings atomic.Int32
			served := make(chan error, 1)
			go func() {
				served <- s.serveReopening(ctx, func() (net.Conn, error) {
					openings.Add(1)
					return reopen(guestEnd), nil
				})
			}()
			defer func() {
				cancel()
				if err := <-served; !errors.Is(err, context.Canceled) {
					t.Errorf("serveReopening: %v", err)
				}
			}()

			// The session that is saved: a live control stream, a call
			// answered.
			oldPort := reopen(hostEnd)
			old := connectHost(t, ctx, oldPort)
			if err := old.ping(ctx); err != nil {
				t.Fatalf("first session: %v", err)
			}
			// The old host vanishes: its reads stop, the guest is not
			// told. A last frame of the old host (a yamux ping) makes the
			// stale session answer: a frame the new host must discard.
			oldPort.Close()
			old.sess.Close()
			newPort := reopen(hostEnd)
			if _, err := newPort.Write([]byte("\x00\x02\x00\x01\x00\x00\x00\x00\x00\x00\x00\x07")); err != nil {
				t.Fatal(err)
			}

			start := time.Now()
			cur := connectHost(t, ctx, newPort)
			if err := cur.ping(ctx); err != nil {
				t.Fatalf("session after the handover: %v", err)
			}
			t.Logf("answered %v after the new host connected; port opened %d times", time.Since(start).Round(time.Millisecond), openings.Load())
			if n := openings.Load(); n < 2 {
				t.Errorf("port opened %d times; the stale session did not end", n)
			}
		})
	}
}
