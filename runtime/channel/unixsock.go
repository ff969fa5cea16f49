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

// DialUnix connects to the unix socket at path, whatever its length. A
// sandbox's sockets live in its state directory, whose name holds the
// containerd namespace and the sandbox id (up to 76 bytes each), so their
// paths may not fit a sockaddr_un: such a path is reached through its
// directory, opened O_PATH for the dial, as /proc/self/fd/<fd>/<name>.
// Errors name path, not the /proc alias.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) <= MaxSocketPath {
		return d.DialContext(ctx, "unix", path)
	}
	dir, name := filepath.Split(path)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"},
			Err: fmt.Errorf("open the socket's directory: %w", err)}
	}
	defer unix.Close(fd)
	alias := "/proc/self/fd/" + strconv.Itoa(fd) + "/" + name
	if len(alias) > MaxSocketPath {
		return nil, &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"},
			Err: fmt.Errorf("socket name %q is longer than a unix socket path allows", name)}
	}
	c, err := d.DialContext(ctx, "unix", alias)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) {
			oe.Addr = &net.UnixAddr{Name: path, Net: "unix"}
		}
		return nil, err
	}
	return c, nil
}
