package manager

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/fifo"
	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// logFifo is the fifo in the bundle that containerd copies into its own
// log, named as containerd's shims name it.
const logFifo = "log"

// newLogger returns a logger writing text to w.
func newLogger(ctx context.Context, w io.Writer, debug bool) context.Context {
	l := logrus.New()
	l.SetOutput(w)
	l.SetFormatter(&logrus.TextFormatter{TimestampFormat: log.RFC3339NanoFixed, FullTimestamp: true})
	l.SetLevel(logrus.InfoLevel)
	if debug {
		l.SetLevel(logrus.DebugLevel)
	}
	fields := log.G(ctx).Data
	return log.WithLogger(ctx, logrus.NewEntry(l).WithFields(fields))
}

// actionLog sends the logs of start and delete to the bundle's log fifo
// if containerd reads it, and nowhere otherwise: their stdout is the
// answer to containerd (1.6 and 2.x read it with stderr merged in), so
// nothing else may go there. The returned func closes the fifo.
func actionLog(ctx context.Context, bundle string, debug bool) (context.Context, func()) {
	f, err := os.OpenFile(filepath.Join(bundle, logFifo), os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return newLogger(ctx, io.Discard, false), func() {}
	}
	return newLogger(ctx, f, debug), func() { f.Close() }
}

// serverLog makes the bundle's log fifo the server's stderr, so that
// panics land there too, and logs to it. If containerd is not there to
// read it (a test), stderr stays as it is.
func serverLog(ctx context.Context, debug bool) (context.Context, io.Closer) {
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	f, err := fifo.OpenFifoDup2(octx, logFifo, unix.O_WRONLY, 0o700, int(os.Stderr.Fd()))
	if err != nil {
		return newLogger(ctx, os.Stderr, debug), nopCloser{}
	}
	return newLogger(ctx, os.Stderr, debug), f
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }
