package agenttest

import (
	"context"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/agent"
)

// SocketPair returns two connected unix stream sockets: the host's and
// the guest's ends of an agent channel, without a VM.
func SocketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

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
