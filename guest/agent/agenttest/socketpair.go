package agenttest

import (
	"context"
	"net"
	"testing"

	"github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/api/conntest"
)

// SocketPair returns two connected unix stream sockets: the host's and
// the guest's ends of an agent channel, without a VM.
func SocketPair(t testing.TB) (net.Conn, net.Conn) { return conntest.SocketPair(t) }

// Serve runs svc's session on conn until the test ends; the cleanup stops
// it and waits for it to return.
func Serve(t testing.TB, svc *agent.Service, conn net.Conn) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = svc.Serve(ctx, conn)
	}()
	t.Cleanup(func() {
		cancel()
		<-served
		conn.Close()
	})
}
