package channel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// MaxSocketPath is the longest path a sockaddr_un holds (108 bytes with
// its NUL).
const MaxSocketPath = 107

// DialUnix connects to the unix stream socket at path, whatever its
// length. A sandbox's sockets live in its state directory, whose name
// holds the containerd namespace and the sandbox id (up to 76 bytes
// each), so their paths may not fit a sockaddr_un: such a path is
// reached through its directory, opened O_PATH for the dial, as
// /proc/self/fd/<fd>/<name>. Errors name path, not the /proc alias.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	return DialUnixNetwork(ctx, "unix", path)
}

// DialUnixNetwork is DialUnix for network "unix" or "unixpacket".
func DialUnixNetwork(ctx context.Context, network, path string) (net.Conn, error) {
	var c net.Conn
	err := viaDir("dial", network, path, func(addr string) (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// ListenUnix binds and listens on the unix socket at path (network "unix"
// or "unixpacket"), whatever its length, as DialUnix reaches it. The
// listener does not remove path when closed.
func ListenUnix(network, path string) (*net.UnixListener, error) {
	var ln *net.UnixListener
	err := viaDir("listen", network, path, func(addr string) (err error) {
		ln, err = net.ListenUnix(network, &net.UnixAddr{Name: addr, Net: network})
		return err
	})
	if ln != nil {
		ln.SetUnlinkOnClose(false)
	}
	return ln, err
}

// viaDir calls f with path, or, for a path longer than a sockaddr_un
// holds, with its alias through its directory; f's errors name path.
func viaDir(op, network, path string, f func(addr string) error) error {
	rename := func(err error) error {
		var oe *net.OpError
		if errors.As(err, &oe) {
			oe.Addr = &net.UnixAddr{Name: path, Net: network}
		}
		return err
	}
	if len(path) <= MaxSocketPath {
		return f(path)
	}
	dir, name := filepath.Split(path)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &net.OpError{Op: op, Net: network, Addr: &net.UnixAddr{Name: path, Net: network},
			Err: fmt.Errorf("open the socket's directory: %w", err)}
	}
	defer unix.Close(fd)
	alias := "/proc/self/fd/" + strconv.Itoa(fd) + "/" + name
	if len(alias) > MaxSocketPath {
		return &net.OpError{Op: op, Net: network, Addr: &net.UnixAddr{Name: path, Net: network},
			Err: fmt.Errorf("socket name %q is longer than a unix socket path allows", name)}
	}
	return rename(f(alias))
}
