//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/api"
)

const (
	// maxPortConns bounds the forwarded connections the guest carries
	// at once; the host bounds its own (fewer).
	maxPortConns = 256
	// portDialTimeout bounds the connect to the guest's loopback; the
	// host waits for the answer a little longer.
	portDialTimeout = 5 * time.Second
	// portIdle is how long a forwarded connection whose one direction
	// has ended waits for progress of the other (api.Splice).
	portIdle = 30 * time.Second
)

// portConns counts the forwarded connections the guest carries. The
// zero value is ready.
type portConns struct {
	n atomic.Int32
}

// take counts one more, and reports false (counting nothing) when
// maxPortConns are carried already.
func (p *portConns) take() bool {
	if p.n.Add(1) > maxPortConns {
		p.n.Add(-1)
		return false
	}
	return true
}

func (p *portConns) release() { p.n.Add(-1) }

// DialPort connects to a port of the guest's loopback, in the agent's
// network namespace (where the containers of a sandbox with a network
// run), and splices the connection to the port stream the host opened.
// It answers once connected; the splice goes on after the answer, and
// ends with the connection, the stream or the session.
func (s *Service) DialPort(ctx context.Context, req *api.DialPortRequest) (*api.Empty, error) {
	if req.Port == 0 || req.Port > 65535 {
		return nil, fmt.Errorf("port %d: want 1-65535: %w", req.Port, errdefs.ErrInvalidArgument)
	}
	if err := api.ValidID(req.StreamId); err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	host := "127.0.0.1"
	if req.Ipv6 {
		host = "::1"
	}
	addr := net.JoinHostPort(host, strconv.Itoa(int(req.Port)))
	if !s.ports.take() {
		return nil, fmt.Errorf("forward to %s: %d connections are forwarded already: %w", addr, maxPortConns, errdefs.ErrResourceExhausted)
	}
	streams, err := s.streams.claim(ctx, req.StreamId, []api.StreamKind{api.StreamPort}, s.cfg.StreamTimeout)
	if err != nil {
		s.ports.release()
		return nil, err
	}
	stream := streams[api.StreamPort]
	d := net.Dialer{Timeout: portDialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		_ = stream.Close()
		s.ports.release()
		return nil, dialError(addr, err)
	}
	logger := log.G(ctx).WithField("addr", addr)
	go func() {
		defer s.ports.release()
		in, out, err := api.Splice(stream, conn, portIdle)
		logger.WithError(err).WithField("bytes_in", in).WithField("bytes_out", out).Debug("forwarded connection ended")
	}()
	return &api.Empty{}, nil
}

// dialError says why a connect to addr failed: NotFound when nothing
// listens there or the guest has no such address, which the host tells
// from the others.
func dialError(addr string, err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, unix.ECONNREFUSED):
		return fmt.Errorf("nothing listens on %s in the guest: %w", addr, errdefs.ErrNotFound)
	case errors.Is(err, unix.EADDRNOTAVAIL), errors.Is(err, unix.ENETUNREACH), errors.Is(err, unix.EAFNOSUPPORT):
		return fmt.Errorf("the guest has no %s: %v: %w", addr, err, errdefs.ErrNotFound)
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("connect to %s in the guest: %v: %w", addr, err, context.DeadlineExceeded)
	}
	return fmt.Errorf("connect to %s in the guest: %w", addr, err)
}
