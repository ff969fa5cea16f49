package manager

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// maxSocketPath is the longest unix socket path containerd's shims accept.
const maxSocketPath = 106

// socketAddress is the address of the shim serving sandbox id, computed as
// containerd's shim helpers do (pkg/shim CreateSocketAddress): a hash of
// containerd's address, the namespace and the id, so two containerds on one
// host never share a shim.
func socketAddress(socketDir, grpcAddress, ns, id string) (string, error) {
	d := sha256.Sum256([]byte(filepath.Join(grpcAddress, ns, id)))
	path := fmt.Sprintf("%s/%x", filepath.Clean(socketDir), d)
	if len(path) > maxSocketPath {
		return "", fmt.Errorf("shim socket %q is longer than %d bytes: use a shorter socket directory", path, maxSocketPath)
	}
	return "unix://" + path, nil
}

// socketPath is the filesystem path of a unix:// address; an address
// without the scheme is an abstract socket (containerd 1.4 and older).
func socketPath(address string) string {
	if p, ok := strings.CutPrefix(address, "unix://"); ok {
		return p
	}
	return "\x00" + address
}

// listen creates the shim's socket, readable by its owner only. If a live
// shim already listens there it returns errShimRunning.
func listen(address string) (*net.UnixListener, error) {
	path := socketPath(address)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("shim socket directory: %w", err)
	}
	l, err := net.Listen("unix", path)
	if errors.Is(err, syscall.EADDRINUSE) {
		if canConnect(address) {
			return nil, errShimRunning
		}
		// Left by a shim that died: take it over.
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale shim socket: %w", err)
		}
		l, err = net.Listen("unix", path)
	}
	if err != nil {
		return nil, fmt.Errorf("listen on shim socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("shim socket: %w", err)
	}
	return l.(*net.UnixListener), nil
}

var errShimRunning = errors.New("a shim already serves this socket")

// canConnect says whether a shim answers at address.
func canConnect(address string) bool {
	c, err := net.DialTimeout("unix", socketPath(address), 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// removeSocket removes the socket file at address, if it has one.
func removeSocket(address string) {
	if p := socketPath(address); !strings.HasPrefix(p, "\x00") {
		_ = os.Remove(p)
	}
}
