package api

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// spliceBuffer is what each direction of a Splice reads at a time.
const spliceBuffer = 32 << 10

// Splice copies a to b and b to a until both directions have ended, then
// closes both; it is how both ends of a port stream (DialPort) carry a
// TCP connection. A direction ends at its source's EOF, and its
// destination is then half-closed: CloseWrite where the connection has
// one (TCP), else Close, which for a stream of the agent session sends a
// FIN and leaves it readable. Once one direction has ended, the other
// ends too when it makes no progress (no byte read, no write done) for
// idle, so that a peer that never closes its half cannot keep a
// connection forever. An error either way ends both at once. It returns
// the bytes copied each way and the first error, nil for a clean end.
func Splice(a, b net.Conn, idle time.Duration) (aToB, bToA int64, err error) {
	type result struct {
		toB bool
		n   int64
		err error
	}
	var lingering atomic.Bool
	results := make(chan result, 2)
	go func() {
		n, err := pump(b, a, &lingering, idle)
		results <- result{toB: true, n: n, err: err}
	}()
	go func() {
		n, err := pump(a, b, &lingering, idle)
		results <- result{n: n, err: err}
	}()
	for range 2 {
		r := <-results
		if r.toB {
			aToB = r.n
		} else {
			bToA = r.n
		}
		switch {
		case r.err != nil && err == nil:
			err = r.err
			// Ends the other direction's reads and writes now.
			_ = a.SetDeadline(time.Now())
			_ = b.SetDeadline(time.Now())
		case err == nil && !lingering.Load():
			lingering.Store(true)
			// The other direction may be waiting with no deadline: it
			// gets one, which it renews as it makes progress.
			src, dst := a, b
			if r.toB {
				src, dst = b, a
			}
			_ = src.SetReadDeadline(time.Now().Add(idle))
			_ = dst.SetWriteDeadline(time.Now().Add(idle))
		}
	}
	_ = a.Close()
	_ = b.Close()
	return aToB, bToA, err
}

// pump copies src to dst until src's EOF, then half-closes dst. Once
// lingering is set, each read and write gets idle to finish.
func pump(dst, src net.Conn, lingering *atomic.Bool, idle time.Duration) (int64, error) {
	buf := make([]byte, spliceBuffer)
	var n int64
	for {
		if lingering.Load() {
			_ = src.SetReadDeadline(time.Now().Add(idle))
		}
		m, rerr := src.Read(buf)
		if m > 0 {
			if lingering.Load() {
				_ = dst.SetWriteDeadline(time.Now().Add(idle))
			}
			w, werr := dst.Write(buf[:m])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
		}
		if errors.Is(rerr, io.EOF) {
			return n, closeWrite(dst)
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// closeWrite ends what c sends, leaving it readable where it can.
func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}
