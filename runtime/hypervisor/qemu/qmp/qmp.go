// Package qmp is a small client for the QEMU Machine Protocol: one
// connection, typed errors, request ids, asynchronous events fanned out to
// bounded subscriptions, and context cancellation on every call.
//
// QEMU's output is treated as untrusted: lines are bounded, a malformed
// message ends the connection instead of being guessed at, and a slow event
// consumer loses old events rather than stalling command replies.
package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/containerd/errdefs"
)

// DefaultMaxLineBytes bounds one QMP message. The largest reply the product
// reads (query-qmp-schema, ~200 KiB on QEMU 7.2) fits with room to spare.
const DefaultMaxLineBytes = 1 << 20

// DefaultEventBuffer is the capacity of a subscription made with a
// non-positive size.
const DefaultEventBuffer = 64

// ErrClosed is wrapped by errors from calls on a client whose connection has
// ended, whether by Close or because QEMU went away.
var ErrClosed = errors.New("qmp connection closed")

// errClosedByClient is the reason recorded by Close, to tell it apart from
// QEMU closing the connection.
var errClosedByClient = fmt.Errorf("%w by client", ErrClosed)

// Error is an error reply from QEMU.
type Error struct {
	// Class is QEMU's error class, e.g. "GenericError", "CommandNotFound",
	// "DeviceNotFound".
	Class string `json:"class"`
	// Desc is QEMU's human-readable description.
	Desc string `json:"desc"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("qmp: %s: %s", e.Class, e.Desc)
}

// Event is an asynchronous notification from QEMU.
type Event struct {
	// Name is the event name, e.g. "SHUTDOWN", "STOP", "RESUME",
	// "GUEST_PANICKED", "RESET".
	Name string
	// Data is the event's payload, undecoded (may be empty).
	Data json.RawMessage
	// Time is when QEMU emitted the event.
	Time time.Time
}

// Greeting is what QEMU says when a client connects.
type Greeting struct {
	Version      Version  `json:"version"`
	Capabilities []string `json:"capabilities"`
}

// Options tune a Client. The zero value is usable.
type Options struct {
	// MaxLineBytes bounds one message from QEMU; 0 means
	// DefaultMaxLineBytes. A longer line ends the connection.
	MaxLineBytes int
}

// Client is one QMP connection. It is safe for concurrent use.
type Client struct {
	conn     net.Conn
	greeting Greeting
	maxLine  int

	// writeMu serializes request writes so that messages never
	// interleave on the wire.
	writeMu sync.Mutex

	// mu guards the fields below it.
	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan response
	subs    map[*subscription]struct{}
	err     error // why the connection ended; set once, before done closes

	done     chan struct{} // closed when the reader has stopped
	closeOne sync.Once
}

type response struct {
	ret json.RawMessage
	err error
}

// subscription is one consumer of events.
type subscription struct {
	ch chan Event
}

// Dial connects to the QMP unix socket at path, reads the greeting and
// negotiates capabilities, all bounded by ctx.
func Dial(ctx context.Context, path string, opts Options) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connect qmp socket %s: %w", path, err)
	}
	c, err := New(ctx, conn, opts)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// New runs the QMP handshake on conn, bounded by ctx, and returns a client
// that owns conn. On error conn is closed.
func New(ctx context.Context, conn net.Conn, opts Options) (_ *Client, retErr error) {
	defer func() {
		if retErr != nil {
			conn.Close()
		}
	}()
	maxLine := opts.MaxLineBytes
	if maxLine <= 0 {
		maxLine = DefaultMaxLineBytes
	}
	br := bufio.NewReaderSize(conn, 64<<10)

	// The greeting is read before the reader goroutine exists, so ctx is
	// enforced through the read deadline.
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	line, err := readLine(br, maxLine)
	if !stop() || ctx.Err() != nil {
		return nil, fmt.Errorf("read qmp greeting: %w", ctx.Err())
	}
	if err != nil {
		return nil, fmt.Errorf("read qmp greeting: %w", err)
	}
	conn.SetReadDeadline(time.Time{})
	var g struct {
		QMP *Greeting `json:"QMP"`
	}
	if err := json.Unmarshal(line, &g); err != nil || g.QMP == nil {
		return nil, fmt.Errorf("read qmp greeting: not a QMP greeting: %q", truncate(line, 128))
	}

	c := &Client{
		conn:     conn,
		greeting: *g.QMP,
		maxLine:  maxLine,
		pending:  make(map[uint64]chan response),
		subs:     make(map[*subscription]struct{}),
		done:     make(chan struct{}),
	}
	go c.readLoop(br)
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, fmt.Errorf("negotiate qmp capabilities: %w", err)
	}
	return c, nil
}

// Greeting returns what QEMU said on connect.
func (c *Client) Greeting() Greeting { return c.greeting }

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err says why the connection ended; nil while it is up.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection. Pending calls fail with ErrClosed and event
// subscriptions are closed. Safe to call more than once.
func (c *Client) Close() error {
	c.shutdown(errClosedByClient)
	<-c.done
	return nil
}

// Subscribe returns a channel of the events QEMU sends from now on, holding
// up to size events (DefaultEventBuffer if size <= 0). When the consumer
// falls behind, the oldest buffered event is dropped to make room: a
// consumer must not be able to stall command replies. The channel is closed
// when the connection ends or cancel is called.
func (c *Client) Subscribe(size int) (events <-chan Event, cancel func()) {
	if size <= 0 {
		size = DefaultEventBuffer
	}
	s := &subscription{ch: make(chan Event, size)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		close(s.ch)
		return s.ch, func() {}
	}
	c.subs[s] = struct{}{}
	return s.ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, ok := c.subs[s]; ok {
			delete(c.subs, s)
			close(s.ch)
		}
	}
}

// Execute runs command cmd with args (marshalled to JSON; nil for none) and
// decodes the reply into result (ignored if nil). An error reply is a
// *Error. If ctx ends first, Execute returns ctx's error; QEMU may still
// carry the command out.
func (c *Client) Execute(ctx context.Context, cmd string, args any, result any) error {
	return c.execute(ctx, cmd, args, result, nil)
}

// execute is Execute sending oob (SCM_RIGHTS ancillary data, or nil) with
// the request's bytes.
func (c *Client) execute(ctx context.Context, cmd string, args any, result any, oob []byte) error {
	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        uint64 `json:"id"`
	}{Execute: cmd, Arguments: args}

	ch := make(chan response, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	c.nextID++
	req.ID = c.nextID
	c.pending[req.ID] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, req.ID)
		c.mu.Unlock()
	}()

	msg, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("qmp %s: encode arguments: %w", cmd, err)
	}
	if err := c.write(ctx, append(msg, '\n'), oob); err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}

	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("qmp %s: %w", cmd, r.err)
		}
		if result != nil {
			if err := json.Unmarshal(r.ret, result); err != nil {
				return fmt.Errorf("qmp %s: decode reply: %w", cmd, err)
			}
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

// write sends one message, with oob (ancillary data) on its first bytes
// if given. A write cut short by ctx leaves a partial message on the wire,
// after which the stream cannot be trusted, so the connection is ended.
func (c *Client) write(ctx context.Context, msg, oob []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	var uc *net.UnixConn
	if oob != nil {
		var ok bool
		if uc, ok = c.conn.(*net.UnixConn); !ok {
			// Checked before anything is written, so the stream
			// stays whole.
			return fmt.Errorf("%w: passing a file descriptor needs a unix socket, not %T", errdefs.ErrNotImplemented, c.conn)
		}
	}
	stop := context.AfterFunc(ctx, func() { c.conn.SetWriteDeadline(time.Unix(1, 0)) })
	var err error
	if uc != nil {
		err = writeWithRights(uc, msg, oob)
	} else {
		_, err = c.conn.Write(msg)
	}
	if !stop() {
		c.shutdown(fmt.Errorf("%w: write interrupted: %v", ErrClosed, ctx.Err()))
		return ctx.Err()
	}
	if err != nil {
		c.shutdown(fmt.Errorf("%w: write: %v", ErrClosed, err))
		return fmt.Errorf("%w: %v", ErrClosed, err)
	}
	return nil
}

// shutdown records why the connection ends and closes it; the reader then
// fails pending calls and closes subscriptions.
func (c *Client) shutdown(why error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = why
	}
	c.mu.Unlock()
	c.closeOne.Do(func() { c.conn.Close() })
}

// message is any line QEMU sends after the greeting.
type message struct {
	Return    json.RawMessage `json:"return"`
	Error     *Error          `json:"error"`
	ID        *uint64         `json:"id"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

func (c *Client) readLoop(br *bufio.Reader) {
	var why error
	for {
		line, err := readLine(br, c.maxLine)
		if err != nil {
			why = fmt.Errorf("%w: %v", ErrClosed, err)
			break
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var m message
		if err := json.Unmarshal(line, &m); err != nil {
			why = fmt.Errorf("%w: malformed message from qemu: %q", ErrClosed, truncate(line, 128))
			break
		}
		switch {
		case m.Event != "":
			c.publish(m)
		case m.ID != nil:
			c.deliver(*m.ID, m)
		default:
			// A reply without an id answers a request QEMU could not
			// parse; this client never sends one, so nothing waits.
		}
	}
	c.shutdown(why)

	c.mu.Lock()
	err := c.err
	for id, ch := range c.pending {
		ch <- response{err: err}
		delete(c.pending, id)
	}
	for s := range c.subs {
		close(s.ch)
		delete(c.subs, s)
	}
	c.mu.Unlock()
	close(c.done)
}

func (c *Client) deliver(id uint64, m message) {
	r := response{ret: m.Return}
	if m.Error != nil {
		r.err = m.Error
	} else if m.Return == nil {
		r.err = errors.New("reply has neither return nor error")
	}
	c.mu.Lock()
	ch, ok := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if ok {
		ch <- r // buffered; each id is delivered at most once
	}
}

func (c *Client) publish(m message) {
	ev := Event{Name: m.Event, Data: m.Data}
	if m.Timestamp != nil {
		ev.Time = time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.subs {
		select {
		case s.ch <- ev:
			continue
		default:
		}
		// Full: drop the oldest. Only this goroutine sends, and it holds
		// mu, so the send below then finds room.
		select {
		case <-s.ch:
		default:
		}
		s.ch <- ev
	}
}

// readLine reads one newline-terminated line of at most max bytes.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return nil, fmt.Errorf("message longer than %d bytes", max)
		}
		line = append(line, frag...)
		if err == nil {
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
