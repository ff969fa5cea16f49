package api

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/containerd/log"
)

// Every agent session starts with a handover of the channel, before yamux:
//
//	host:  HELLO, HELLO, ... (every helloInterval)   guest: WELCOME
//	host:  START                                      then yamux, both ways
//
// Each frame is an 8-byte magic and the host's 16-byte nonce, fresh for
// each session. The channel is a byte stream that may hold anything
// before the handover: a guest restored from a snapshot resumes inside
// the session it had when saved and may still be sending its frames, or
// may read the new host's bytes with that stale session; on
// virtio-serial a guest that boots finds every HELLO sent while it booted
// queued in its port. So both ends scan for their frame and discard the
// rest, the host says HELLO until it is answered, and START, which follows
// every HELLO in the stream, tells the guest where the session begins.
//
// No byte of a frame is zero. A stale yamux session in the guest expects
// a header whose first byte, the version, is 0: wherever in a HELLO its
// next read of a header begins, it fails at once (ErrInvalidVersion); the
// agent ends it and starts a handshake, which a later HELLO completes.
const (
	helloMagic   = "\x89CCNHELO"
	welcomeMagic = "\x89CCNWLCM"
	startMagic   = "\x89CCNSTRT"

	magicLen = len(helloMagic)
	nonceLen = 16
	// frameLen is the length of every handshake frame.
	frameLen = magicLen + nonceLen
)

// helloInterval paces the host's HELLOs: a lost one (read by a stale
// session) costs at most this much, and a guest that is slow to boot
// finds 40 a second of boot in its port, under 1 KiB.
const helloInterval = 25 * time.Millisecond

// maxHostDiscard bounds what the host reads from the guest before the
// WELCOME. A stale session may still be sending a process's output when
// the handover begins, up to a 512 KiB stream window per stream; more
// than a few windows' worth is a broken or hostile guest.
const maxHostDiscard = 4 << 20

// readBufSize is the read size of both ends while they scan.
const readBufSize = 4 << 10

// ErrHandshakeOverrun is returned by HostHandshake when the guest sends
// more than it may before answering.
var ErrHandshakeOverrun = errors.New("the guest sent too much before answering")

// aLongTimeAgo is a deadline in the past: it ends a blocked Read or Write.
var aLongTimeAgo = time.Unix(1, 0)

type nonce [nonceLen]byte

// frameOf returns magic followed by n.
func frameOf(magic string, n nonce) (f [frameLen]byte) {
	copy(f[:], magic)
	copy(f[magicLen:], n[:])
	return f
}

// HostHandshake hands conn over to a new session, host side: it sends
// HELLO until the guest answers WELCOME with its nonce, discarding what
// the guest sent before, then sends START. The session (yamux) begins on
// the returned conn, which first yields what was read past the WELCOME.
//
// ctx bounds the wait for the guest: when it ends, a blocked Read or
// Write of conn ends too (through conn's deadlines, which the handshake
// clears when done; a conn without deadlines is closed). On error conn
// is left unusable and the caller closes it.
func HostHandshake(ctx context.Context, conn net.Conn) (net.Conn, error) {
	n := newNonce()
	rest, err := hostHello(ctx, conn, n)
	if err != nil {
		return nil, err
	}
	start := frameOf(startMagic, n)
	stop := context.AfterFunc(ctx, func() { expire(conn) })
	defer stop()
	if _, err := conn.Write(start[:]); err != nil {
		if ctx.Err() != nil {
			err = ctxErr(ctx)
		}
		return nil, fmt.Errorf("agent handshake: send start: %w", err)
	}
	if !stop() {
		return nil, fmt.Errorf("agent handshake: %w", ctxErr(ctx))
	}
	_ = conn.SetDeadline(time.Time{})
	return withLeftover(conn, rest), nil
}

// HostPark is the first half of a handshake: it sends HELLO until the
// guest answers WELCOME, and sends no START, so that the guest's agent is
// left waiting in its handshake, as the next host finds it: the state a
// template is saved in, whose clones' hosts each start a session of
// their own (a HELLO with another nonce is answered in turn). conn is
// left with no deadline and stays the caller's to close.
func HostPark(ctx context.Context, conn net.Conn) error {
	if _, err := hostHello(ctx, conn, newNonce()); err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Time{})
	return nil
}

// newNonce is a random nonce with no zero byte.
func newNonce() nonce {
	var n nonce
	_, _ = rand.Read(n[:]) // crypto/rand.Read does not fail
	for i := range n {
		if n[i] == 0 {
			n[i] = 1
		}
	}
	return n
}

// hostHello sends HELLO with nonce n until the guest answers WELCOME, and
// returns what was read past it.
func hostHello(ctx context.Context, conn net.Conn, n nonce) ([]byte, error) {
	hello, welcome := frameOf(helloMagic, n), frameOf(welcomeMagic, n)

	stop := context.AfterFunc(ctx, func() { expire(conn) })
	defer stop()
	answered := make(chan struct{})
	type sent struct {
		hellos int
		err    error
	}
	wrote := make(chan sent, 1)
	go func() {
		hellos, err := sayHello(conn, hello[:], answered)
		if err != nil {
			// The reader may wait for an answer that cannot come.
			_ = conn.SetReadDeadline(aLongTimeAgo)
		}
		wrote <- sent{hellos, err}
	}()
	rest, discarded, rerr := awaitWelcome(conn, welcome[:])
	if rerr != nil {
		// The writer may be blocked on a guest that does not read.
		expire(conn)
	}
	close(answered)
	w := <-wrote
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("agent handshake: no answer from the guest after %d hellos (%d bytes read): %w", w.hellos, discarded, ctxErr(ctx))
	case rerr != nil && (w.err == nil || !errors.Is(rerr, os.ErrDeadlineExceeded)):
		return nil, fmt.Errorf("agent handshake: %w", rerr)
	case w.err != nil:
		return nil, fmt.Errorf("agent handshake: send hello: %w", w.err)
	}
	if !stop() {
		return nil, fmt.Errorf("agent handshake: %w", ctxErr(ctx))
	}
	log.G(ctx).WithField("hellos", w.hellos).WithField("discarded_bytes", discarded).Debug("agent handshake: welcomed")
	return rest, nil
}

// sayHello writes hello at once and then every helloInterval until
// answered is closed, and returns how many it wrote. It returns between
// writes only, so that no HELLO follows the START.
func sayHello(conn net.Conn, hello []byte, answered <-chan struct{}) (int, error) {
	t := time.NewTicker(helloInterval)
	defer t.Stop()
	for n := 0; ; {
		if _, err := conn.Write(hello); err != nil {
			return n, err
		}
		n++
		select {
		case <-answered:
			return n, nil
		case <-t.C:
		}
	}
}

// awaitWelcome reads conn until welcome (magic and nonce) has been read,
// and returns what was read after it and how many bytes came before it.
func awaitWelcome(conn net.Conn, welcome []byte) (rest []byte, discarded int, err error) {
	var m matcher
	m.reset(welcome)
	buf := make([]byte, readBufSize)
	read := 0
	for {
		n, err := conn.Read(buf)
		for i := range n {
			if m.feed(buf[i]) {
				return buf[i+1 : n], read + i + 1 - len(welcome), nil
			}
		}
		read += n
		if read > maxHostDiscard {
			return nil, read, fmt.Errorf("%w (%d bytes)", ErrHandshakeOverrun, read)
		}
		if errors.Is(err, io.EOF) {
			return nil, read, fmt.Errorf("the guest closed the agent channel without answering (%d bytes read): %w", read, err)
		}
		if err != nil {
			return nil, read, err
		}
	}
}

// GuestHandshake takes conn over for a new session, guest side: it
// discards what it reads until a HELLO, answers WELCOME with the HELLO's
// nonce, and then discards (the HELLOs sent meanwhile) until the START
// with that nonce. A HELLO with another nonce is another host's (one that
// replaced a host that died mid-handshake): it is answered in turn and
// its START awaited instead. The session (yamux) begins on the returned
// conn, which first yields what was read past the START.
//
// Only ctx bounds the wait; when it ends, a blocked Read or Write of conn
// ends too, as with HostHandshake. EOF before the START is an error (on
// virtio-serial: no host is connected).
func GuestHandshake(ctx context.Context, conn net.Conn) (net.Conn, error) {
	stop := context.AfterFunc(ctx, func() { expire(conn) })
	defer stop()
	var g guestScan
	g.hello.reset([]byte(helloMagic))
	buf := make([]byte, readBufSize)
	for {
		n, err := conn.Read(buf)
		for i := range n {
			switch g.feed(buf[i]) {
			case guestAnswer:
				welcome := frameOf(welcomeMagic, g.nonce)
				if _, werr := conn.Write(welcome[:]); werr != nil {
					if ctx.Err() != nil {
						werr = ctxErr(ctx)
					}
					return nil, fmt.Errorf("agent handshake: send welcome: %w", werr)
				}
			case guestStart:
				if !stop() {
					return nil, fmt.Errorf("agent handshake: %w", ctxErr(ctx))
				}
				_ = conn.SetDeadline(time.Time{})
				log.G(ctx).WithField("hellos", g.hellos).WithField("answers", g.answers).
					WithField("discarded_bytes", g.read+i+1-frameLen*(g.hellos+1)).Debug("agent handshake done")
				return withLeftover(conn, buf[i+1:n]), nil
			}
		}
		g.read += n
		if err != nil {
			if ctx.Err() != nil {
				err = ctxErr(ctx)
			}
			return nil, fmt.Errorf("agent handshake: waiting for the host (%d hellos, %d answered): %w", g.hellos, g.answers, err)
		}
	}
}

// guestEvent is what a byte fed to guestScan completes.
type guestEvent uint8

const (
	guestNone   guestEvent = iota
	guestAnswer            // a HELLO with a new nonce: answer it
	guestStart             // the START of the nonce answered last
)

// guestScan is the guest's side of the handshake as a byte-at-a-time
// state machine, whatever the reads' boundaries.
type guestScan struct {
	// hello finds the HELLO magic; start finds the START of the nonce
	// answered last, once there is one.
	hello, start matcher
	// startFrame is start's pattern.
	startFrame [frameLen]byte
	// nonce is the nonce answered last, valid if answers > 0.
	nonce nonce
	// collecting is set after a HELLO magic, while its nonce's bytes
	// come into pending; got counts them. Neither magic is looked for in
	// a nonce.
	collecting bool
	pending    nonce
	got        int
	// hellos and answers count HELLOs read and answered; read counts
	// the bytes of the reads before the current one.
	hellos, answers, read int
}

func (g *guestScan) feed(b byte) guestEvent {
	if g.collecting {
		return g.collect(b)
	}
	if g.answers > 0 && g.start.feed(b) {
		return guestStart
	}
	if g.hello.feed(b) {
		g.start.n = 0
		g.collecting, g.got = true, 0
		g.hellos++
	}
	return guestNone
}

// collect takes the next byte of a HELLO's nonce.
func (g *guestScan) collect(b byte) guestEvent {
	g.pending[g.got] = b
	g.got++
	if g.got < nonceLen {
		return guestNone
	}
	g.collecting = false
	if g.answers > 0 && g.pending == g.nonce {
		return guestNone // a HELLO repeated while the answer was on its way
	}
	g.nonce = g.pending
	g.answers++
	g.startFrame = frameOf(startMagic, g.nonce)
	g.start.reset(g.startFrame[:])
	return guestAnswer
}

// matcher finds a pattern of up to frameLen bytes in a stream fed to it a
// byte at a time (Knuth-Morris-Pratt), so that a pattern split across
// reads, or one that begins inside a partial one, is found.
type matcher struct {
	pat []byte
	// border[i] is the length of the longest proper prefix of pat[:i+1]
	// that is also its suffix.
	border [frameLen]uint8
	// n is how many bytes of pat the stream ends with.
	n int
}

func (m *matcher) reset(pat []byte) {
	m.pat, m.n = pat, 0
	k := 0
	for i := 1; i < len(pat); i++ {
		for k > 0 && pat[i] != pat[k] {
			k = int(m.border[k-1])
		}
		if pat[i] == pat[k] {
			k++
		}
		m.border[i] = uint8(k)
	}
}

// feed reports whether b completes the pattern; the next feed starts a
// new match.
func (m *matcher) feed(b byte) bool {
	for m.n > 0 && b != m.pat[m.n] {
		m.n = int(m.border[m.n-1])
	}
	if b == m.pat[m.n] {
		m.n++
	}
	if m.n == len(m.pat) {
		m.n = 0
		return true
	}
	return false
}

// expire ends conn's blocked reads and writes.
func expire(conn net.Conn) {
	if conn.SetDeadline(aLongTimeAgo) != nil {
		_ = conn.Close()
	}
}

// ctxErr is ctx's error, with its cause when the cause says more.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// withLeftover returns conn, or, if the handshake read past its end, a
// conn whose reads first yield those bytes.
func withLeftover(conn net.Conn, rest []byte) net.Conn {
	if len(rest) == 0 {
		return conn
	}
	return &leftoverConn{Conn: conn, rest: append([]byte(nil), rest...)}
}

// leftoverConn is a conn whose reads first yield rest.
type leftoverConn struct {
	net.Conn
	mu   sync.Mutex // guards rest
	rest []byte
}

func (c *leftoverConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.rest) > 0 {
		n := copy(p, c.rest)
		c.rest = c.rest[n:]
		if len(c.rest) == 0 {
			c.rest = nil
		}
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}
