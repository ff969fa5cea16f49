package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"github.com/hashicorp/yamux"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/api"
)

// The host's decoding of what the guest sends, fuzzed: a reply of any
// bytes to any call (FuzzGuestReply), and any bytes in place of the
// session itself (FuzzGuestSession). Whatever arrives, the client must
// not panic or hang, must keep within its bounds, and must say what went
// wrong with an errdefs class.

// rawAgent is a guest agent that answers every call with the reply set
// last: raw bytes as the response's payload, or an error status.
type rawAgent struct {
	mu sync.Mutex // guards payload and err
	// payload is the encoded reply; err, if set, is answered instead.
	payload []byte
	err     error
}

func (a *rawAgent) set(payload []byte, err error) {
	a.mu.Lock()
	a.payload, a.err = payload, err
	a.mu.Unlock()
}

// answer is the handler of every method: the request is read as an
// empty message (its fields become unknown ones) and the reply is an
// empty message whose unknown fields are the payload, which the server
// writes out byte for byte.
func (a *rawAgent) answer(ctx context.Context, unmarshal func(any) error) (any, error) {
	if err := unmarshal(&emptypb.Empty{}); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return nil, a.err
	}
	reply := &emptypb.Empty{}
	reply.ProtoReflect().SetUnknown(protoreflect.RawFields(append([]byte(nil), a.payload...)))
	return reply, nil
}

// agentMethods are the Agent service's methods that fuzzCalls make.
var agentMethods = []string{
	"Ping", "SyncGuest", "StartProcess", "WaitProcess", "SignalProcess", "CloseStdin", "ResizePty",
	"CreateContainer", "StartContainer", "ExecProcess", "KillContainer", "PauseContainer",
	"UpdateContainer", "ContainerStats", "ContainerPids", "NextEvent",
}

// connListener hands conns to a ttrpc server.
type connListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error { l.once.Do(func() { close(l.done) }); return nil }

func (l *connListener) Addr() net.Addr { return &net.UnixAddr{Name: "raw-agent", Net: "unix"} }

// newRawHarness connects a Client to a rawAgent over a real yamux session.
func newRawHarness(t testing.TB) (*Client, *rawAgent) {
	t.Helper()
	host, guest := agenttest.SocketPair(t)
	type served struct {
		sess *yamux.Session
		err  error
	}
	guestSide := make(chan served, 1)
	go func() {
		sess, err := yamuxServerForTest(guest)
		guestSide <- served{sess, err}
	}()
	c, err := Connect(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	g := <-guestSide
	if g.err != nil {
		t.Fatal(g.err)
	}
	sess := g.sess
	a := &rawAgent{}
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]ttrpc.Method{}
	for _, m := range agentMethods {
		methods[m] = a.answer
	}
	srv.RegisterService("cocoon.agent.v1.Agent", &ttrpc.ServiceDesc{Methods: methods})
	l := &connListener{conns: make(chan net.Conn), done: make(chan struct{})}
	go func() { _ = srv.Serve(context.Background(), l) }()
	go acceptGuestStreams(sess, l)
	t.Cleanup(func() {
		c.Close()
		l.Close()
		_ = srv.Close()
		sess.Close()
	})
	return c, a
}

// acceptGuestStreams serves the control stream; the client's fuzzed
// calls open no other.
func acceptGuestStreams(sess *yamux.Session, l *connListener) {
	for {
		s, err := sess.AcceptStream()
		if err != nil {
			return
		}
		h, err := api.ReadStreamHeader(s)
		if err != nil || h.Kind != api.StreamControl {
			s.Close()
			continue
		}
		select {
		case l.conns <- s:
		case <-l.done:
			s.Close()
			return
		}
	}
}

// fuzzCalls are the client calls whose replies are fuzzed. Each returns
// what it made of the reply and checks the bounds the client promises.
var fuzzCalls = []func(ctx context.Context, t *testing.T, c *Client) error{
	func(ctx context.Context, t *testing.T, c *Client) error {
		info, err := c.Ping(ctx)
		if len(info.Version) > maxInfoString || len(info.KernelRelease) > maxInfoString || info.Uptime < 0 || info.InitDuration < 0 {
			t.Errorf("ping: %+v out of bounds", info)
		}
		return err
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		_, err := newFuzzProcess(c).Wait(ctx)
		return err
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		pids, err := c.ContainerPids(ctx, "c1")
		if len(pids) > maxPids {
			t.Errorf("%d pids accepted, at most %d", len(pids), maxPids)
		}
		return err
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		_, err := c.ContainerStats(ctx, "c1")
		return err
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		ev, err := c.NextEvent(ctx)
		if len(ev.ContainerID) > maxInfoString || (ev.Kind != EventUnknown && ev.Kind != EventOOM) {
			t.Errorf("event %+v out of bounds", ev)
		}
		return err
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		_, err := c.Start(ctx, ProcessSpec{ID: "p1", Args: []string{"true"}})
		return err
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		_, err := c.CreateContainer(ctx, ContainerCreate{ID: "c1", ProcessID: "p1", Spec: []byte("{}")})
		return err
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		_, err := c.ExecProcess(ctx, ExecCreate{ContainerID: "c1", ProcessID: "p2", Process: []byte("{}")})
		return err
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		_, err := c.SyncGuest(ctx, GuestSync{WallTime: time.Now(), Hostname: "h"})
		return err
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		return c.KillContainer(ctx, "c1", syscall.SIGTERM, true)
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		return c.StartContainer(ctx, "c1")
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		return c.UpdateContainer(ctx, "c1", []byte("{}"))
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		return newFuzzProcess(c).Signal(ctx, syscall.SIGKILL, false)
	},
	func(ctx context.Context, t *testing.T, c *Client) error {
		return newFuzzProcess(c).CloseStdin(ctx)
	},
}

// newFuzzProcess is a started process with no stdio, as Start makes it.
func newFuzzProcess(c *Client) *Process {
	p := &Process{c: c, id: "p1", outputDone: make(chan struct{}), stdinSem: make(chan struct{}, 1), stdinCopied: make(chan struct{}), waitSem: make(chan struct{}, 1)}
	close(p.outputDone)
	return p
}

// maxErrorText bounds an error's text: the client's own words around
// the guest's message, which is cut to maxGuestMessage.
const maxErrorText = maxGuestMessage + 512

// FuzzGuestReply answers one client call with fuzzed bytes, or with an
// error status of a fuzzed code and message. A reply the client cannot
// decode or will not accept is errdefs.ErrDataLoss; an error status keeps
// its code's class; no error's text grows with what the guest sent.
func FuzzGuestReply(f *testing.F) {
	f.Add(uint8(0), []byte{}, uint8(0), "")
	f.Add(uint8(0), []byte("\x0a\x05cocoa\x12\x031.0"), uint8(0), "")
	f.Add(uint8(1), []byte("\x08\x89\x01\x10\x09"), uint8(0), "")
	f.Add(uint8(2), []byte("\x0a\x03\x01\x02\x03"), uint8(0), "")
	f.Add(uint8(3), []byte("\x0a\x04\x32\x02\x0a\x00"), uint8(0), "")
	f.Add(uint8(4), []byte("\x08\x01\x12\x02c1\x18\x03"), uint8(0), "")
	f.Add(uint8(5), []byte("\xff\xff\xff"), uint8(0), "")
	f.Add(uint8(6), []byte{}, uint8(codes.NotFound), "container c1: not found")
	f.Add(uint8(13), []byte{}, uint8(codes.FailedPrecondition), "process p1 is still starting")
	c, a := newRawHarness(f)
	f.Fuzz(func(t *testing.T, call uint8, payload []byte, code uint8, msg string) {
		var answer error
		if code != 0 {
			// What the fake can send: a status's message is a proto
			// string (one that is not UTF-8 fails to decode on the host,
			// as a payload's strings do).
			msg = strings.ToValidUTF8(msg, "?")
			answer = status.Error(codes.Code(code%17), msg)
			if code%17 == 0 {
				answer = status.Error(codes.Unknown, msg)
			}
		}
		a.set(payload, answer)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := fuzzCalls[int(call)%len(fuzzCalls)](ctx, t, c)
		switch {
		case ctx.Err() != nil:
			t.Fatalf("call %d did not return: %v", call, err)
		case err == nil:
			if answer != nil {
				t.Fatalf("call %d: the guest's error status %v was lost", call, answer)
			}
		case len(err.Error()) > maxErrorText:
			t.Fatalf("call %d: error text of %d bytes", call, len(err.Error()))
		case answer == nil && !errdefs.IsDataLoss(err):
			t.Fatalf("call %d: a reply the client refused is not data loss: %v", call, err)
		case answer != nil && errdefs.IsDataLoss(err) && status.Code(answer) != codes.DataLoss:
			t.Fatalf("call %d: status %v came back as data loss: %v", call, status.Code(answer), err)
		}
		// The session survives whatever the reply was.
		a.set(nil, nil)
		if _, err := c.Ping(ctx); err != nil {
			t.Fatalf("after call %d: %v", call, err)
		}
	})
}

// FuzzGuestSession puts fuzzed bytes on the agent channel in place of the
// guest's side of the session. The client's call returns, by the time its
// context ends at the latest, and nothing panics.
func FuzzGuestSession(f *testing.F) {
	f.Add([]byte{})
	// A yamux window update acknowledging stream 1, then garbage.
	f.Add([]byte("\x00\x01\x00\x02\x00\x00\x00\x01\x00\x00\x00\x00junk"))
	// A guest-opened stream (SYN on stream 2), which ends the session.
	f.Add([]byte("\x00\x01\x00\x01\x00\x00\x00\x02\x00\x00\x00\x00"))
	// A go-away.
	f.Add([]byte("\x00\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01"))
	// A data frame larger than the window.
	f.Add([]byte("\x00\x00\x00\x02\x00\x00\x00\x01\x7f\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		host, guest := net.Pipe()
		defer guest.Close()
		go func() {
			taken, err := api.GuestHandshake(context.Background(), guest)
			if err != nil {
				return
			}
			// What the host writes is read all along, also while b is
			// being written: net.Pipe has no buffer, and a host whose
			// session ended on b would otherwise wait in a write of its
			// own (the close) for a guest waiting in this one.
			go func() { _, _ = io.Copy(io.Discard, taken) }()
			_, _ = taken.Write(b)
		}()
		c, err := Connect(context.Background(), host)
		if err != nil {
			return
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = c.Ping(ctx)
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("ping took %v with a 50ms deadline", took)
		}
		if err == nil {
			return
		}
		if !errdefs.IsUnavailable(err) && !errdefs.IsDataLoss(err) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("ping on a garbled session: %v, want unavailable, data loss or the deadline", err)
		}
	})
}

// TestGuestReplyBounds: replies larger than the client takes are refused
// as data loss before they are decoded, and a guest's error message is
// cut.
func TestGuestReplyBounds(t *testing.T) {
	c, a := newRawHarness(t)
	ctx := testCtx(t, 10*time.Second)
	metrics, err := proto.Marshal(&api.ContainerStatsResponse{Metrics: make([]byte, maxMetricsBytes+1)})
	if err != nil {
		t.Fatal(err)
	}
	a.set(metrics, nil)
	if _, err := c.ContainerStats(ctx, "c1"); !errdefs.IsDataLoss(err) {
		t.Errorf("%d bytes of metrics: %v, want data loss", maxMetricsBytes+1, err)
	}
	pids, err := proto.Marshal(&api.ContainerPidsResponse{Pids: make([]uint32, maxPids+1)})
	if err != nil {
		t.Fatal(err)
	}
	a.set(pids, nil)
	if _, err := c.ContainerPids(ctx, "c1"); !errdefs.IsDataLoss(err) {
		t.Errorf("%d pids: %v, want data loss", maxPids+1, err)
	}
	a.set(nil, status.Error(codes.NotFound, strings.Repeat("x", 1<<20)))
	err = c.StartContainer(ctx, "c1")
	if !errdefs.IsNotFound(err) || len(err.Error()) > maxErrorText || !strings.HasSuffix(err.Error(), "[truncated]") {
		t.Errorf("a 1 MiB error message: %d bytes, %v", len(err.Error()), errdefs.IsNotFound(err))
	}
}

// TestControlStreamResetEndsSession: a guest that resets the control
// stream (a yamux window update with ACK and RST on stream 1) leaves no
// agent: the call in flight is unavailable, and the session ends, so
// that Done tells whoever watches it.
func TestControlStreamResetEndsSession(t *testing.T) {
	host, guest := net.Pipe()
	defer guest.Close()
	go func() {
		taken, err := api.GuestHandshake(context.Background(), guest)
		if err != nil {
			return
		}
		// The control stream's SYN and its header (two frames), then
		// the reset.
		if _, err := io.ReadFull(taken, make([]byte, 12+12+6)); err != nil {
			return
		}
		_, _ = taken.Write([]byte("\x00\x01\x00\x0a\x00\x00\x00\x01\x00\x00\x00\x00"))
		_, _ = io.Copy(io.Discard, taken)
	}()
	c, err := Connect(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Ping(testCtx(t, 5*time.Second)); !errdefs.IsUnavailable(err) {
		t.Errorf("ping on a reset control stream: %v, want unavailable", err)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the session outlived its control stream")
	}
}
