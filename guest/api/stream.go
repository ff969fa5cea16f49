package api

import (
	"errors"
	"fmt"
	"io"
	"regexp"
)

// The agent channel carries one yamux session. The host opens every stream
// and starts it with a header that says what the stream is for: the control
// stream (ttrpc), one stdio stream of a process, the stream a
// container's writable layer comes back on (ExportLayer), or a TCP
// connection forwarded to a port of the guest's loopback (DialPort). The
// guest reads the header before anything else and drops the stream if it
// is malformed.
//
// Header layout (all fields fixed-size except the id):
//
//	magic "CCN1" | kind (1 byte) | id length (1 byte) | id
const headerMagic = "CCN1"

// StreamKind says what a stream of the agent session carries.
type StreamKind uint8

const (
	// StreamControl carries the ttrpc Agent service.
	StreamControl StreamKind = iota + 1
	// StreamStdin carries a process's stdin, host to guest.
	StreamStdin
	// StreamStdout carries a process's stdout (or its terminal), guest to host.
	StreamStdout
	// StreamStderr carries a process's stderr, guest to host.
	StreamStderr
	// StreamLayer carries a container's writable layer as a layer diff,
	// guest to host; its id is the stream_id of ExportLayer.
	StreamLayer
	// StreamPort carries a TCP connection to a port of the guest's
	// loopback, both ways; its id is the stream_id of DialPort.
	StreamPort
)

func (k StreamKind) String() string {
	switch k {
	case StreamControl:
		return "control"
	case StreamStdin:
		return "stdin"
	case StreamStdout:
		return "stdout"
	case StreamStderr:
		return "stderr"
	case StreamLayer:
		return "layer"
	case StreamPort:
		return "port"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// MaxIDLen bounds process ids.
const MaxIDLen = 64

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ValidID reports whether id may name a process.
func ValidID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("process id %q: must be 1-%d characters of [A-Za-z0-9._-]", id, MaxIDLen)
	}
	return nil
}

// StreamHeader opens every stream of the agent session.
type StreamHeader struct {
	Kind StreamKind
	// ID names the process for stdio streams, the export for a layer
	// stream and the dial for a port stream; empty for the control
	// stream.
	ID string
}

// ErrBadHeader is returned for a stream whose header is malformed.
var ErrBadHeader = errors.New("malformed stream header")

// WriteStreamHeader writes h to w.
func WriteStreamHeader(w io.Writer, h StreamHeader) error {
	if err := h.validate(); err != nil {
		return err
	}
	buf := make([]byte, 0, len(headerMagic)+2+len(h.ID))
	buf = append(buf, headerMagic...)
	buf = append(buf, byte(h.Kind), byte(len(h.ID)))
	buf = append(buf, h.ID...)
	_, err := w.Write(buf)
	return err
}

// ReadStreamHeader reads and validates a header from r. It never reads past
// the header.
func ReadStreamHeader(r io.Reader) (StreamHeader, error) {
	var fixed [len(headerMagic) + 2]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return StreamHeader{}, fmt.Errorf("%w: %v", ErrBadHeader, err)
	}
	if string(fixed[:len(headerMagic)]) != headerMagic {
		return StreamHeader{}, fmt.Errorf("%w: bad magic %q", ErrBadHeader, fixed[:len(headerMagic)])
	}
	h := StreamHeader{Kind: StreamKind(fixed[len(headerMagic)])}
	n := int(fixed[len(headerMagic)+1])
	if n > MaxIDLen {
		return StreamHeader{}, fmt.Errorf("%w: id length %d over %d", ErrBadHeader, n, MaxIDLen)
	}
	if n > 0 {
		id := make([]byte, n)
		if _, err := io.ReadFull(r, id); err != nil {
			return StreamHeader{}, fmt.Errorf("%w: %v", ErrBadHeader, err)
		}
		h.ID = string(id)
	}
	if err := h.validate(); err != nil {
		return StreamHeader{}, fmt.Errorf("%w: %v", ErrBadHeader, err)
	}
	return h, nil
}

func (h StreamHeader) validate() error {
	switch h.Kind {
	case StreamControl:
		if h.ID != "" {
			return errors.New("control stream carries no id")
		}
		return nil
	case StreamStdin, StreamStdout, StreamStderr, StreamLayer, StreamPort:
		return ValidID(h.ID)
	}
	return fmt.Errorf("unknown stream kind %d", uint8(h.Kind))
}
