//go:build linux

package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/cocoonrt/cocoon/guest/api"
)

// consoleTimeout bounds the wait for the pty master the runtime sent before
// it returned.
const consoleTimeout = 5 * time.Second

// maxSocketPath is what fits in sockaddr_un.sun_path.
const maxSocketPath = 107

// containerIO is the stdio of a container process while the OCI runtime starts it:
// pipes that the runtime hands on as the process's fds 0-2, or for a terminal a
// console socket on which the runtime sends the pty master.
type containerIO struct {
	pio     *stdio
	streams streamSet
	// null is the runtime's stdio when the process has a terminal.
	null *os.File
	// listener and socketPath are the console socket (terminal only).
	listener   *net.UnixListener
	socketPath string
}

// newContainerIO claims the process's stdio streams and prepares its
// pipes or console socket.
func (s *Service) newContainerIO(ctx context.Context, id string, terminal, stdin, stdout, stderr bool) (_ *containerIO, retErr error) {
	var want []api.StreamKind
	if stdin {
		want = append(want, api.StreamStdin)
	}
	if stdout {
		want = append(want, api.StreamStdout)
	}
	if stderr {
		want = append(want, api.StreamStderr)
	}
	streams, err := s.streams.claim(ctx, id, want, s.cfg.StreamTimeout)
	if err != nil {
		return nil, err
	}
	cio := &containerIO{streams: streams}
	defer func() {
		if retErr != nil {
			cio.abort()
		}
	}()
	if !terminal {
		req := &api.StartProcessRequest{Id: id, Stdin: stdin, Stdout: stdout, Stderr: stderr}
		cio.pio, err = newStdio(req, streams, s.stdioTimes())
		if err != nil {
			return nil, err
		}
		return cio, nil
	}
	cio.pio = newStdioEnds(id, true, streams, s.stdioTimes())
	if cio.null, err = os.OpenFile(os.DevNull, os.O_RDWR, 0); err != nil {
		return nil, err
	}
	cs := s.containers
	cs.mu.Lock()
	cs.consoleSeq++
	seq := cs.consoleSeq
	cs.mu.Unlock()
	if err := os.MkdirAll(cs.dir, 0o711); err != nil {
		return nil, err
	}
	path := filepath.Join(cs.dir, fmt.Sprintf("console-%d.sock", seq))
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("console socket path %s is longer than %d bytes: %w", path, maxSocketPath, errdefs.ErrInvalidArgument)
	}
	_ = os.Remove(path)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("console socket: %w", err)
	}
	cio.listener, cio.socketPath = l, path
	return cio, nil
}

// ociStdio is what the runtime gets as its fds 0-2.
func (c *containerIO) ociStdio() [3]*os.File {
	if c.null != nil {
		return [3]*os.File{c.null, c.null, c.null}
	}
	return c.pio.child
}

// started finishes the set-up once the runtime has started the process: the
// process's ends of the pipes are closed here, and a terminal's master
// is received.
func (c *containerIO) started() error {
	c.pio.closeChild()
	if c.listener == nil {
		return nil
	}
	defer c.closeSocket()
	master, err := receiveConsole(c.listener)
	if err != nil {
		return err
	}
	c.pio.console = master
	c.pio.outputs = []*os.File{master}
	return nil
}

// abort releases everything when the process did not start.
func (c *containerIO) abort() {
	if c.pio != nil {
		c.pio.closeFiles()
	}
	c.streams.closeAll()
	c.closeSocket()
}

func (c *containerIO) closeSocket() {
	if c.listener != nil {
		_ = c.listener.Close()
		_ = os.Remove(c.socketPath)
		c.listener = nil
	}
	if c.null != nil {
		_ = c.null.Close()
		c.null = nil
	}
}

// receiveConsole accepts the runtime's connection on the console socket and
// returns the pty master it sent, non-blocking so that it can be read
// with deadlines.
func receiveConsole(l *net.UnixListener) (*os.File, error) {
	_ = l.SetDeadline(time.Now().Add(consoleTimeout))
	conn, err := l.AcceptUnix()
	if err != nil {
		return nil, fmt.Errorf("receive terminal from the OCI runtime: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(consoleTimeout))
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	name := make([]byte, 256)
	oob := make([]byte, unix.CmsgSpace(4*4))
	var n, oobn int
	var rerr error
	// MSG_CMSG_CLOEXEC: the descriptor must not leak into a process the
	// agent forks meanwhile, or the terminal would never hang up.
	if err := raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), name, oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	}); err != nil {
		return nil, fmt.Errorf("receive terminal from the OCI runtime: %w", err)
	}
	if rerr != nil {
		return nil, fmt.Errorf("receive terminal from the OCI runtime: %w", rerr)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, fmt.Errorf("receive terminal from the OCI runtime: %w", err)
	}
	var fds []int
	for i := range msgs {
		if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		return nil, fmt.Errorf("the OCI runtime sent %d descriptors for the terminal, want 1: %w", len(fds), errdefs.ErrUnknown)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		_ = unix.Close(fds[0])
		return nil, err
	}
	return os.NewFile(uintptr(fds[0]), string(name[:n])), nil
}

// marshalMetrics serializes cgroup statistics for the host.
func marshalMetrics(m *stats.Metrics) ([]byte, error) {
	return proto.Marshal(m)
}
