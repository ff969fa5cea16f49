//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/hashicorp/yamux"

	"github.com/cocoonrt/cocoon/guest/api"
)

// Session bounds, guest side.
const (
	// headerTimeout bounds the wait for a new stream's header.
	headerTimeout = 10 * time.Second
	// maxPendingHeaders bounds streams whose header is still awaited.
	maxPendingHeaders = 64
	// maxControlStreams bounds concurrent control streams per session.
	maxControlStreams = 8
	// streamWindow is the per-stream receive window. Larger than yamux's
	// 256 KiB default for throughput; small enough for a small guest.
	streamWindow = 512 << 10
)

// yamuxConfig returns the guest's yamux settings; runtime/agent uses the
// same values on the host. Keepalive is off: a VM paused for a snapshot, or crawling under
// software emulation, must not lose its session; the host watches the VM
// process instead. Stream open and write timeouts are long for the same
// reason.
func yamuxConfig(ctx context.Context) *yamux.Config {
	return &yamux.Config{
		AcceptBacklog:          maxPendingHeaders,
		EnableKeepAlive:        false,
		KeepAliveInterval:      time.Minute, // unused, but must be positive
		ConnectionWriteTimeout: time.Minute,
		MaxStreamWindowSize:    streamWindow,
		StreamOpenTimeout:      0, // none: the host's start deadline bounds the wait
		StreamCloseTimeout:     2 * time.Minute,
		Logger:                 log.G(ctx).WithField("component", "yamux"),
	}
}

// Serve runs one agent session over conn until the host ends it, conn
// fails or ctx is done. Processes outlive the session; their stdio
// streams do not.
//
// The session starts with the handover of the channel
// (api.GuestHandshake), for which Serve waits as long as ctx lasts: a
// session never gives up on its host. Whatever conn held before, a
// booting guest's queued HELLOs or what a stale session left, goes
// there.
func (s *Service) Serve(ctx context.Context, conn net.Conn) error {
	taken, err := api.GuestHandshake(ctx, conn)
	if err != nil {
		_ = conn.Close()
		return err
	}
	s.sessions.Add(1)
	sess, err := yamux.Server(taken, yamuxConfig(ctx))
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("start agent session: %w", err)
	}
	defer sess.Close()

	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(mapErrors))
	if err != nil {
		return fmt.Errorf("new ttrpc server: %w", err)
	}
	api.RegisterAgentService(srv, s)
	control := newStreamListener(sess.Addr())
	defer srv.Close()
	defer control.Close()
	go func() {
		if err := srv.Serve(ctx, control); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, ttrpc.ErrServerClosed) {
			log.G(ctx).WithError(err).Warn("ttrpc server ended")
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			_ = sess.Close()
		case <-sess.CloseChan():
		}
	}()

	pending := make(chan struct{}, maxPendingHeaders)
	for {
		stream, err := sess.AcceptStream()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, yamux.ErrSessionShutdown) {
				return nil
			}
			return fmt.Errorf("accept stream: %w", err)
		}
		select {
		case pending <- struct{}{}:
		default:
			log.G(ctx).Warn("too many streams without a header; dropping one")
			_ = stream.Close()
			continue
		}
		go func() {
			defer func() { <-pending }()
			s.route(ctx, stream, control)
		}()
	}
}

// route reads a stream's header and hands the stream to its owner.
func (s *Service) route(ctx context.Context, stream *yamux.Stream, control *streamListener) {
	_ = stream.SetReadDeadline(time.Now().Add(headerTimeout))
	h, err := api.ReadStreamHeader(stream)
	_ = stream.SetReadDeadline(time.Time{})
	if err != nil {
		log.G(ctx).WithError(err).Warn("dropping stream")
		_ = stream.Close()
		return
	}
	if h.Kind == api.StreamControl {
		control.deliver(ctx, stream)
		return
	}
	if err := s.streams.deliver(h.ID, h.Kind, stream); err != nil {
		log.G(ctx).WithError(err).WithField("kind", h.Kind).Warn("dropping stream")
	}
}

// mapErrors turns errdefs errors into gRPC status codes, once, at the
// ttrpc boundary; the host maps them back with errgrpc.ToNative.
func mapErrors(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
	resp, err := method(ctx, unmarshal)
	if err != nil {
		log.G(ctx).WithError(err).WithField("method", info.FullMethod).Debug("call failed")
		return nil, errgrpc.ToGRPC(err)
	}
	return resp, nil
}

// streamListener feeds control streams to the ttrpc server.
type streamListener struct {
	addr  net.Addr
	conns chan net.Conn
	// active counts delivered control streams not yet closed.
	active chan struct{}
	closed chan struct{}
	once   sync.Once
}

func newStreamListener(addr net.Addr) *streamListener {
	return &streamListener{
		addr:   addr,
		conns:  make(chan net.Conn),
		active: make(chan struct{}, maxControlStreams),
		closed: make(chan struct{}),
	}
}

func (l *streamListener) deliver(ctx context.Context, c net.Conn) {
	select {
	case l.active <- struct{}{}:
	default:
		log.G(ctx).Warn("too many control streams; dropping one")
		_ = c.Close()
		return
	}
	tc := &trackedConn{Conn: c, release: func() { <-l.active }}
	select {
	case l.conns <- tc:
	case <-l.closed:
		_ = tc.Close()
	}
}

// Accept returns the next control stream.
func (l *streamListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close stops Accept.
func (l *streamListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr is the session's address.
func (l *streamListener) Addr() net.Addr { return l.addr }

// trackedConn releases its control-stream slot once, on Close.
type trackedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *trackedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
