// Package conntest gives tests of the agent channel its two ends without
// a VM. It imports nothing of the project, so every package's tests can
// use it, guest/api's and guest/agent's own included.
package conntest

import (
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// SocketPair returns two connected unix stream sockets: the host's and
// the guest's ends of an agent channel. The test's end closes both.
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
		t.Cleanup(func() { c.Close() })
	}
	return conns[0], conns[1]
}
