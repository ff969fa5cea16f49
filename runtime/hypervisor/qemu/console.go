package qemu

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// consoleRingBytes is how much of the guest console is kept in memory for
// ConsoleTail.
const consoleRingBytes = 64 << 10

// stderrRingBytes is how much of QEMU's own stderr is kept for errors.
const stderrRingBytes = 16 << 10

// DefaultConsoleLogBytes caps console.log when Spec.ConsoleLogBytes is 0.
const DefaultConsoleLogBytes = 1 << 20

// consoleTruncated ends a console.log that reached its cap.
const consoleTruncated = "\n[console log truncated]\n"

// ring keeps the last max bytes written to it. The guest and QEMU write
// whatever they like, so nothing here grows without bound.
type ring struct {
	max int

	// mu guards buf and dropped.
	mu  sync.Mutex
	buf []byte
	// dropped is true once bytes have fallen off the front, which makes
	// the first line in buf partial.
	dropped bool
}

func newRing(max int) *ring { return &ring{max: max, buf: make([]byte, 0, max)} }

func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	if len(p) >= r.max {
		r.buf = append(r.buf[:0], p[len(p)-r.max:]...)
		r.dropped = true
		return n, nil
	}
	if over := len(r.buf) + len(p) - r.max; over > 0 {
		r.buf = r.buf[:copy(r.buf, r.buf[over:])]
		r.dropped = true
	}
	r.buf = append(r.buf, p...)
	return n, nil
}

// Tail returns up to n of the last lines, made safe to print: carriage
// returns and other control characters dropped, invalid UTF-8 replaced. A
// line cut by the ring's start is left out; an unfinished last line is
// included.
func (r *ring) Tail(n int) []string {
	if n <= 0 {
		return nil
	}
	r.mu.Lock()
	data := bytes.Clone(r.buf)
	dropped := r.dropped
	r.mu.Unlock()

	if dropped {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		} else {
			data = nil
		}
	}
	data = bytes.TrimRight(data, "\r\n")
	if len(data) == 0 {
		return nil
	}
	lines := bytes.Split(data, []byte{'\n'})
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = printable(l)
	}
	return out
}

func printable(b []byte) string {
	s := strings.ToValidUTF8(string(b), string(utf8.RuneError))
	return strings.Map(func(r rune) rune {
		if r == '\t' || !unicode.IsControl(r) {
			return r
		}
		return -1
	}, s)
}

// cappedLog writes the console to a file up to a byte limit, then ends it
// with note (consoleTruncated if empty) and drops the rest. Only its pump
// writes to it, so it needs no lock.
type cappedLog struct {
	f       *os.File
	limit   int64
	note    string
	written int64
	full    bool
}

func (l *cappedLog) Write(p []byte) (int, error) {
	if l.full {
		return len(p), nil
	}
	note := l.note
	if note == "" {
		note = consoleTruncated
	}
	room := l.limit - int64(len(note)) - l.written
	if int64(len(p)) <= room {
		n, err := l.f.Write(p)
		l.written += int64(n)
		return len(p), err
	}
	l.full = true
	if room > 0 {
		l.f.Write(p[:room])
	}
	_, err := l.f.WriteString(note)
	return len(p), err
}

// pumpConsole copies the guest console from QEMU's stdout into the ring and
// the log until QEMU closes it. A failing log write (disk full) stops the
// log, never the ring: the pipe must keep draining or the guest stalls on
// its serial port.
func pumpConsole(r io.Reader, rg *ring, lg *cappedLog) {
	buf := make([]byte, 4096)
	logOK := lg != nil
	for {
		n, err := r.Read(buf)
		if n > 0 {
			rg.Write(buf[:n])
			if logOK {
				if _, werr := lg.Write(buf[:n]); werr != nil {
					logOK = false
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// pumpStderr copies QEMU's stderr into the ring and hands each line, bounded,
// to logLine.
func pumpStderr(r io.Reader, rg *ring, logLine func(string)) {
	br := bufio.NewReaderSize(r, 1024)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			rg.Write(line)
			if s := strings.TrimSpace(printable(line)); s != "" {
				logLine(s)
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}
