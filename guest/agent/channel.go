//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/log"
	"github.com/mdlayher/vsock"
)

// VirtioPortsDir is where the kernel lists virtio-serial ports by name.
const VirtioPortsDir = "/sys/class/virtio-ports"

// FindSerialPort returns the device node (/dev/vportNpM) of the
// virtio-serial port called name, looking in portsDir (VirtioPortsDir).
func FindSerialPort(portsDir, name string) (string, error) {
	entries, err := os.ReadDir(portsDir)
	if err != nil {
		return "", fmt.Errorf("list virtio ports: %w", err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(portsDir, e.Name(), "name"))
		if err != nil {
			continue
		}
		if strings.TrimSpace(string(b)) == name {
			return filepath.Join("/dev", e.Name()), nil
		}
	}
	return "", fmt.Errorf("no virtio-serial port named %q in %s: %w", name, portsDir, os.ErrNotExist)
}

// serialConn is an open virtio-serial port as a net.Conn. The port is a
// character device that the poller handles, so deadlines work.
type serialConn struct {
	*os.File
}

type serialAddr string

func (a serialAddr) Network() string { return "virtio-serial" }
func (a serialAddr) String() string  { return string(a) }

func (c serialConn) LocalAddr() net.Addr  { return serialAddr(c.Name()) }
func (c serialConn) RemoteAddr() net.Addr { return serialAddr("host") }

// ServeSerial serves sessions on the virtio-serial port called name until
// ctx is done. The port has no connections: a session ends when the host
// side disconnects (reads return EOF) or when the host starts a new
// handshake on it, and the port is then reopened for the next one, which
// is how a restarted shim or a restored snapshot gets a fresh session.
//
// A guest restored from a snapshot resumes inside the session it had when
// saved. Either QEMU tells it the host is gone first (the stale session
// reads EOF), or the stale session reads the new host's HELLO and fails
// on its first byte (see api.GuestHandshake); in both cases Serve returns
// and the next session's handshake answers a later HELLO, which the host
// repeats until it is answered.
func (s *Service) ServeSerial(ctx context.Context, name string) error {
	missingSince := time.Now()
	warned := false
	// known is the port's device node once it opened: the port keeps it,
	// and the reopen after a restore is on the way to the host's first
	// answer, where a walk of sysfs under emulation costs tens of ms.
	var known string
	return s.serveReopening(ctx, func() (net.Conn, error) {
		if known != "" {
			if f, err := os.OpenFile(known, os.O_RDWR, 0); err == nil {
				return serialConn{f}, nil
			}
		}
		path, err := FindSerialPort(VirtioPortsDir, name)
		if err != nil {
			// Said once, loudly: the host's readiness error quotes
			// the console tail.
			if !warned && time.Since(missingSince) > 5*time.Second {
				log.G(ctx).WithError(err).Warn("agent port missing; is the VM started with the virtio-serial port?")
				warned = true
			}
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			log.G(ctx).WithError(err).WithField("port", path).Warn("open agent port")
			return nil, err
		}
		known = path
		return serialConn{f}, nil
	})
}

// serveReopening serves one session after another, each on a conn that
// open returns (the port opened anew), until ctx is done.
func (s *Service) serveReopening(ctx context.Context, open func() (net.Conn, error)) error {
	backoff := newBackoff()
	for ctx.Err() == nil {
		conn, err := open()
		if err != nil {
			backoff.wait(ctx)
			continue
		}
		began := s.sessions.Load()
		err = s.Serve(ctx, conn)
		_ = conn.Close()
		if err != nil {
			log.G(ctx).WithError(err).Info("agent session ended")
		}
		// A host was there: the next one (a restarted shim, or the
		// host of a restored snapshot or template clone, whose HELLOs
		// ended this session) is expected at once, not after the
		// backoff that a port with no host built up.
		if s.sessions.Load() != began {
			backoff.reset()
		}
		// While no host is connected, reads on the port return EOF at
		// once; the backoff keeps that from spinning.
		backoff.wait(ctx)
	}
	return ctx.Err()
}

// ServeVsock listens on the vsock port and serves a session on each
// connection until ctx is done.
func (s *Service) ServeVsock(ctx context.Context, port uint32) error {
	l, err := vsock.Listen(port, nil)
	if err != nil {
		return fmt.Errorf("listen on vsock port %d: %w", port, err)
	}
	return s.ServeListener(ctx, l)
}

// ServeListener serves a session on each connection accepted from l until
// ctx is done or l fails. It closes l.
func (s *Service) ServeListener(ctx context.Context, l net.Listener) error {
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	defer l.Close()
	backoff := newBackoff()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			log.G(ctx).WithError(err).Warn("accept agent connection")
			backoff.wait(ctx)
			continue
		}
		backoff.reset()
		go func() {
			if err := s.Serve(ctx, conn); err != nil && ctx.Err() == nil {
				log.G(ctx).WithError(err).Info("agent session ended")
			}
		}()
	}
}

// backoff paces retries: 10 ms doubling to 200 ms.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: 10 * time.Millisecond} }

func (b *backoff) reset() { b.d = 10 * time.Millisecond }

func (b *backoff) wait(ctx context.Context) {
	t := time.NewTimer(b.d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	if b.d < 200*time.Millisecond {
		b.d *= 2
	}
}
