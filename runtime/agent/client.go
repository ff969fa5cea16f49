// Package agent is the host's typed client of cocoon-agent, the guest's
// PID 1. Connect hands the agent channel over to a new session (a
// handshake the agent answers), then starts the yamux session over it
// (the host is the yamux client and opens every stream) and the ttrpc
// control stream; Start opens a process's stdio streams and copies them
// to and from the caller's readers and writers.
//
// The guest is treated as hostile: replies are bounded by ttrpc's message
// limit and trimmed, stdio is streamed through bounded windows, and a guest
// that opens a stream of its own ends the session. Agent errors come back
// as errdefs errors (errgrpc.ToNative); a closed session is
// errdefs.ErrUnavailable.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/hashicorp/yamux"
	"google.golang.org/grpc/status"

	"github.com/cocoonrt/cocoon/guest/api"
)

// streamWindow is the per-stream receive window; the guest uses the same.
const streamWindow = 512 << 10

// maxInfoString bounds strings the guest reports about itself.
const maxInfoString = 256

// Client is a connection to one guest's agent. It is safe for concurrent
// use.
type Client struct {
	sess    *yamux.Session
	control net.Conn
	rpc     *ttrpc.Client
	agent   api.AgentService
	// guestNanos is the time spent in calls the guest works on (see
	// GuestTime).
	guestNanos atomic.Int64
	// bound is the limit on working calls (SetCallTimeout); nil: none.
	bound atomic.Pointer[callBound]
}

// callBound is a limit on the calls the guest works on, and what to do
// when the guest misses it.
type callBound struct {
	timeout time.Duration
	missed  func(method string)
}

// waitingMethods are the calls that wait for something to happen in the
// guest rather than work on a request: they do not count as guest time.
// ExportLayer lasts as long as the layer takes to stream: its caller
// bounds it, and ExportLayer counts its time itself. DialPort waits for
// a listener in the guest, and its caller bounds it.
var waitingMethods = map[string]bool{"WaitProcess": true, "NextEvent": true, "ExportLayer": true, "DialPort": true}

// account adds the duration of each call but the waiting ones to the
// guest time.
func (c *Client) account(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, info *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
	if waitingMethods[req.Method] {
		return invoke(ctx, req, resp)
	}
	var expired func() bool
	if b := c.bound.Load(); b != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, b.timeout, errGuestTimeout)
		defer cancel()
		expired = func() bool { return errors.Is(context.Cause(ctx), errGuestTimeout) }
	}
	start := time.Now()
	err := invoke(ctx, req, resp)
	c.guestNanos.Add(int64(time.Since(start)))
	if err != nil && expired != nil && expired() {
		b := c.bound.Load()
		if b != nil && b.missed != nil {
			b.missed(req.Method)
		}
		return fmt.Errorf("the guest agent did not answer within %v: %w: %w", b.timeout, errGuestTimeout, context.DeadlineExceeded)
	}
	return err
}

// errGuestTimeout is the cause of a call that SetCallTimeout's limit
// ended.
var errGuestTimeout = errors.New("guest agent timeout")

// SetCallTimeout bounds every call the guest works on to d (the waits for
// exits and events are not bounded), and calls missed with the method's
// name when the guest fails to answer one in time, from the goroutine
// that made the call. d <= 0 removes the bound.
func (c *Client) SetCallTimeout(d time.Duration, missed func(method string)) {
	if d <= 0 {
		c.bound.Store(nil)
		return
	}
	c.bound.Store(&callBound{timeout: d, missed: missed})
}

// GuestTime is the time spent so far in calls the guest works on, from
// request to answer (the session's transport included); the calls that
// wait for a process exit or an event are left out. Calls that overlap
// are each counted in full.
func (c *Client) GuestTime() time.Duration { return time.Duration(c.guestNanos.Load()) }

// Connect starts the agent session over conn, which the Client then owns.
// It first hands the channel over to the new session (api.HostHandshake),
// so it waits for the agent to take it: a booting guest once its agent
// runs, a restored one once its stale session has given way, whatever
// either left on the channel. ctx bounds that wait (the sandbox's start
// deadline), not the session after it. A guest that closes the channel
// first is errdefs.ErrUnavailable; one that sends too much before
// answering, errdefs.ErrDataLoss.
func Connect(ctx context.Context, conn net.Conn) (*Client, error) {
	taken, err := api.HostHandshake(ctx, conn)
	if err != nil {
		_ = conn.Close()
		switch {
		case ctx.Err() != nil:
			return nil, err
		case errors.Is(err, api.ErrHandshakeOverrun):
			return nil, fmt.Errorf("%w: %w", errdefs.ErrDataLoss, err)
		}
		return nil, unavailable(err)
	}
	cfg := &yamux.Config{
		// The guest never opens streams; a small backlog is enough to
		// notice one that does.
		AcceptBacklog: 4,
		// No keepalive: a VM paused for a snapshot, or crawling under
		// software emulation, must keep its session. The caller
		// watches the VM process instead.
		EnableKeepAlive:        false,
		KeepAliveInterval:      time.Minute,
		ConnectionWriteTimeout: time.Minute,
		MaxStreamWindowSize:    streamWindow,
		// No open timeout: the agent runs by now, but a guest crawling
		// under emulation may be slow to acknowledge; the caller bounds
		// its calls.
		StreamOpenTimeout:  0,
		StreamCloseTimeout: 2 * time.Minute,
		Logger:             log.G(ctx).WithField("component", "yamux"),
	}
	sess, err := yamux.Client(taken, cfg)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("start agent session: %w", err)
	}
	control, err := openStream(sess, api.StreamHeader{Kind: api.StreamControl})
	if err != nil {
		_ = sess.Close()
		return nil, err
	}
	c := &Client{sess: sess, control: control}
	// A control stream that fails (the guest reset it, or sent what
	// ttrpc cannot read) leaves no agent to talk to: the session ends
	// with it, so that Done tells.
	c.rpc = ttrpc.NewClient(control, ttrpc.WithUnaryClientInterceptor(c.account),
		ttrpc.WithOnClose(func() { _ = sess.Close() }))
	c.agent = api.NewAgentClient(c.rpc)
	go c.refuseGuestStreams(ctx)
	return c, nil
}

// refuseGuestStreams ends the session if the guest opens a stream: the
// protocol has none, so the guest is broken or hostile.
func (c *Client) refuseGuestStreams(ctx context.Context) {
	s, err := c.sess.AcceptStream()
	if err != nil {
		return
	}
	_ = s.Close()
	log.G(ctx).Error("guest opened a stream on the agent session; closing the session")
	_ = c.sess.Close()
}

func openStream(sess *yamux.Session, h api.StreamHeader) (*yamux.Stream, error) {
	s, err := sess.OpenStream()
	if err != nil {
		return nil, unavailable(fmt.Errorf("open %s stream: %w", h.Kind, err))
	}
	if err := api.WriteStreamHeader(s, h); err != nil {
		_ = s.Close()
		return nil, unavailable(fmt.Errorf("write %s stream header: %w", h.Kind, err))
	}
	return s, nil
}

func unavailable(err error) error {
	return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
}

// Done is closed when the session has ended.
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// Close ends the session. Processes in the guest keep running.
func (c *Client) Close() error {
	_ = c.rpc.Close()
	return c.sess.Close()
}

// mapErr turns what a call returned into an errdefs error.
func (c *Client) mapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		return fmt.Errorf("%s: %w", op, errgrpc.ToNative(guestStatus(st)))
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", op, err)
	}
	if errors.Is(err, ttrpc.ErrClosed) || errors.Is(err, io.EOF) || errors.Is(err, yamux.ErrConnectionReset) ||
		errors.Is(err, yamux.ErrStreamClosed) || errors.Is(err, yamux.ErrSessionShutdown) || c.sess.IsClosed() {
		return fmt.Errorf("%s: agent connection closed: %w", op, errdefs.ErrUnavailable)
	}
	if malformedReply(err) {
		return fmt.Errorf("%s: the guest sent a malformed reply: %w: %v", op, errdefs.ErrDataLoss, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// GuestInfo is what the agent reports about itself.
type GuestInfo struct {
	// Version of cocoon-agent.
	Version string
	// KernelRelease is the guest's uname -r.
	KernelRelease string
	// Uptime is the guest's CLOCK_BOOTTIME.
	Uptime time.Duration
	// InitDuration is how long the agent's init duties took.
	InitDuration time.Duration
}

// Ping asks the agent for its GuestInfo.
func (c *Client) Ping(ctx context.Context) (GuestInfo, error) {
	resp, err := c.agent.Ping(ctx, &api.PingRequest{})
	if err != nil {
		return GuestInfo{}, c.mapErr("ping agent", err)
	}
	return infoOf(resp), nil
}

// infoOf is the GuestInfo of a ping's answer, its strings bounded.
func infoOf(resp *api.PingResponse) GuestInfo {
	if resp == nil {
		return GuestInfo{}
	}
	return GuestInfo{
		Version:       trim(resp.Version),
		KernelRelease: trim(resp.KernelRelease),
		Uptime:        time.Duration(clampNs(resp.UptimeNs)),
		InitDuration:  time.Duration(clampNs(resp.InitNs)),
	}
}

func trim(s string) string {
	if len(s) > maxInfoString {
		return s[:maxInfoString]
	}
	return s
}

func clampNs(ns uint64) int64 {
	if ns > 1<<62 {
		return 1 << 62
	}
	return int64(ns)
}

// WaitReady pings the agent until it answers or ctx ends, and returns its
// first answer. Callers bound ctx by the sandbox start deadline and also
// watch the VM exit.
//
// Connect has already waited for the agent to take the session (its
// handshake), so a ping is not lost to a guest that is still booting or
// to a stale session of a restored one: one ping is given the whole
// deadline instead of short attempts whose late replies ttrpc would log
// as errors; only a ping that fails outright (not a slow guest) is
// retried, paced so that it cannot spin.
func (c *Client) WaitReady(ctx context.Context) (GuestInfo, error) {
	const pace = 50 * time.Millisecond
	for {
		info, err := c.Ping(ctx)
		if err == nil {
			return info, nil
		}
		t := time.NewTimer(pace)
		select {
		case <-ctx.Done():
			t.Stop()
			return GuestInfo{}, fmt.Errorf("agent not ready: %w (last error: %v)", ctx.Err(), err)
		case <-c.Done():
			t.Stop()
			return GuestInfo{}, fmt.Errorf("agent not ready: connection closed: %w", errdefs.ErrUnavailable)
		case <-t.C:
		}
	}
}

// GuestSync is what SyncGuest sets in the guest.
type GuestSync struct {
	// WallTime is the host's wall clock; zero leaves the guest clock.
	WallTime time.Time
	// Entropy is credited to the guest's random pool (at most 512 bytes).
	Entropy []byte
	// Hostname, if set, becomes the guest's hostname, cut to the 64
	// bytes a Linux hostname holds (a containerd id may have 76).
	Hostname string
}

// maxHostname is the guest kernel's HOST_NAME_MAX.
const maxHostname = 64

// SyncGuest sets the guest's clock, entropy and hostname, and returns
// what the guest says of itself afterwards (as Ping does). It is the
// host's first call on a new session, after a boot and after every
// restore from a snapshot or template: its answer is the guest's
// readiness.
func (c *Client) SyncGuest(ctx context.Context, s GuestSync) (GuestInfo, error) {
	req := &api.SyncGuestRequest{Entropy: s.Entropy, Hostname: s.Hostname}
	if len(req.Hostname) > maxHostname {
		req.Hostname = req.Hostname[:maxHostname]
	}
	if !s.WallTime.IsZero() {
		req.WallTimeUnixNs = s.WallTime.UnixNano()
	}
	resp, err := c.agent.SyncGuest(ctx, req)
	if err != nil {
		return GuestInfo{}, c.mapErr("sync guest", err)
	}
	return infoOf(resp.GetGuest()), nil
}

// Shutdown asks the agent to sync, unmount and power the guest off. A
// session that closes before the reply arrives counts as success: the
// guest went down. The caller then waits for the VM to exit.
func (c *Client) Shutdown(ctx context.Context) error {
	_, err := c.agent.Shutdown(ctx, &api.ShutdownRequest{})
	if err = c.mapErr("shut down guest", err); err != nil && !errdefs.IsUnavailable(err) {
		return err
	}
	return nil
}
