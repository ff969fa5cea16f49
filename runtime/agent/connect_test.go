package agent

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/api"
)

// TestConnectHandshake runs a session with a process's stdio on it, after
// the handshake, over each kind of byte stream the agent channel may be.
func TestConnectHandshake(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conns func(testing.TB) (net.Conn, net.Conn)
	}{
		{"pipe", func(testing.TB) (net.Conn, net.Conn) { return net.Pipe() }},
		{"socketpair", agenttest.SocketPair},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, guest := tc.conns(t)
			h := newHarnessOn(t, host, guest, 0)
			if _, err := h.client.Ping(testCtx(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			st, out, _ := run(t, h.client, ProcessSpec{ID: "echo", Args: []string{"sh", "-c", "echo hello; exit 3"}})
			if out != "hello\n" || st.Code != 3 {
				t.Fatalf("got %q, %+v", out, st)
			}
		})
	}
}

// TestConnectErrors: a guest that closes the channel instead of answering
// is unavailable; one that floods it is data loss.
func TestConnectErrors(t *testing.T) {
	host, guest := agenttest.SocketPair(t)
	guest.Close()
	if _, err := Connect(testCtx(t, 5*time.Second), host); !errdefs.IsUnavailable(err) {
		t.Errorf("closed channel: %v, want unavailable", err)
	}

	host, guest = agenttest.SocketPair(t)
	defer guest.Close()
	go io.Copy(io.Discard, guest)
	go func() {
		junk := make([]byte, 64<<10)
		for {
			if _, err := guest.Write(junk); err != nil {
				return
			}
		}
	}()
	_, err := Connect(testCtx(t, 30*time.Second), host)
	if !errdefs.IsDataLoss(err) || !errors.Is(err, api.ErrHandshakeOverrun) {
		t.Errorf("flooded channel: %v, want data loss", err)
	}
}
