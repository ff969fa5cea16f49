package hooks

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// outputMax is how much of a hook's output is kept for its error: the
// end, where a failing program says why, and no more, however much it
// prints.
const outputMax = 4 << 10

// tail is an io.Writer that keeps the last max bytes written to it.
type tail struct {
	// max is how many bytes are kept.
	max int
	// mu guards buf and cut: exec.Cmd writes from its own goroutine.
	mu sync.Mutex
	// buf is the kept bytes, never more than max (its capacity, from the
	// start).
	buf []byte
	// cut says that bytes were dropped from buf's front.
	cut bool
}

// newTail returns a tail that keeps max bytes.
func newTail(max int) *tail {
	return &tail{max: max, buf: make([]byte, 0, max)}
}

// Write keeps p's end, dropping from the front what no longer fits; it
// never fails, so the hook is never stopped by a full buffer.
func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(p) >= t.max {
		t.cut = t.cut || len(t.buf) > 0 || len(p) > t.max
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return len(p), nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.buf = t.buf[:copy(t.buf, t.buf[over:])]
		t.cut = true
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

// text returns what is kept, from a character's start if the front was
// cut, trimmed of surrounding white space; and whether the front was cut.
func (t *tail) text() (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if t.cut {
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	return strings.TrimSpace(string(b)), t.cut
}
