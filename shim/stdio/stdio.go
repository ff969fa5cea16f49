// Package stdio opens a process's stdio the way containerd hands it to a
// shim: paths of fifos the client made (the usual case), file:///path to
// append the output to a file, or binary:///path?args (and binary-v2) to
// hand the output to a logging binary. Only stdout's form matters for the
// output, as in containerd's runc shim: with file and binary, stderr goes
// to the same place.
//
// Output is flushed to the destination before the process's exit is
// reported: CloseOutput ends what the reader sees (EOF on a fifo, EOF on a
// logging binary's pipes), and Close waits for a logging binary to finish.
package stdio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
)

// Config is a process's stdio as containerd names it.
type Config struct {
	// Stdin is the path of the fifo the client writes the process's input
	// to; empty for none.
	Stdin string
	// Stdout and Stderr are fifo paths or file:// / binary:// URIs;
	// empty for none.
	Stdout, Stderr string
	// Terminal means the process runs on a terminal: its output is all on
	// Stdout.
	Terminal bool
}

// IsNull says whether the process has no stdio at all.
func (c Config) IsNull() bool { return c.Stdin == "" && c.Stdout == "" && c.Stderr == "" }

// IO is a process's open stdio.
type IO struct {
	stdin  io.ReadCloser
	stdout io.Writer
	stderr io.Writer

	// outputs are closed by CloseOutput (each once); keep holds the
	// read sides that keep fifos open for a client that comes back.
	outputs []io.Closer
	keep    []io.Closer
	// dropOnce closes keep once (DropReaders, Close).
	dropOnce sync.Once
	// logger is the logging binary, nil without one.
	logger *logger

	// closeStdinOnce and closeOutputOnce make CloseStdin and CloseOutput
	// idempotent.
	closeStdinOnce  sync.Once
	closeOutputOnce sync.Once
}

// Open opens the stdio of process id of a container in namespace ns. Fifos
// of the output are opened for writing, which waits (within ctx) for the
// client to have opened them for reading, as containerd's clients do
// before they create a task. On error nothing is left open.
func Open(ctx context.Context, ns, id string, c Config) (_ *IO, retErr error) {
	i := &IO{}
	defer func() {
		if retErr != nil {
			_ = i.Close(context.WithoutCancel(ctx))
		}
	}()
	if c.Stdout != "" || (c.Stderr != "" && !c.Terminal) {
		if err := i.openOutput(ctx, ns, id, c); err != nil {
			return nil, err
		}
	}
	if c.Stdin != "" {
		// Non-blocking: the open completes in the background when the
		// client opens its side; reads wait for it.
		f, err := fifo.OpenFifo(context.Background(), c.Stdin, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, fmt.Errorf("open stdin %s: %w", c.Stdin, err)
		}
		i.stdin = f
	}
	return i, nil
}

func (i *IO) openOutput(ctx context.Context, ns, id string, c Config) error {
	uri := c.Stdout
	if uri == "" {
		uri = c.Stderr
	}
	u, err := url.Parse(uri)
	if err != nil {
		return fmt.Errorf("stdout %q: %w: %v", uri, errdefs.ErrInvalidArgument, err)
	}
	switch u.Scheme {
	case "", "fifo":
		return i.openPaths(ctx, c)
	case "file":
		return i.openFile(u.Path, c.Terminal)
	case "binary", "binary-v2":
		l, err := startLogger(ctx, u, ns, id)
		if err != nil {
			return err
		}
		i.logger = l
		i.stdout = l.stdout
		i.outputs = append(i.outputs, l.stdout)
		if !c.Terminal {
			i.stderr = l.stderr
		}
		// A terminal's logger still gets its stderr pipe closed.
		i.outputs = append(i.outputs, l.stderr)
		return nil
	}
	return fmt.Errorf("stdout %q: %w: unknown scheme %q (want a fifo path, file:// or binary://)", uri, errdefs.ErrInvalidArgument, u.Scheme)
}

// openPaths opens plain stdout and stderr paths: fifos, or regular files
// appended to (as containerd's runc shim does). The same path for both is
// opened once.
func (i *IO) openPaths(ctx context.Context, c Config) error {
	var err error
	if c.Stdout != "" {
		if i.stdout, err = i.openPath(ctx, c.Stdout); err != nil {
			return err
		}
	}
	switch {
	case c.Stderr == "" || c.Terminal:
	case c.Stderr == c.Stdout:
		i.stderr = i.stdout
	default:
		if i.stderr, err = i.openPath(ctx, c.Stderr); err != nil {
			return err
		}
	}
	return nil
}

// openPath opens one output path for writing.
func (i *IO) openPath(ctx context.Context, path string) (io.Writer, error) {
	isFifo, err := fifo.IsFifo(path)
	if err != nil {
		return nil, fmt.Errorf("output %s: %w", path, err)
	}
	if !isFifo {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return nil, fmt.Errorf("open output %s: %w", path, err)
		}
		i.outputs = append(i.outputs, f)
		return f, nil
	}
	w, err := fifo.OpenFifo(ctx, path, syscall.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open output fifo %s: %w", path, err)
	}
	i.outputs = append(i.outputs, w)
	// Our own read side keeps the fifo open, so that a client that goes
	// away and comes back (ctr task attach) finds it, as with runc.
	r, err := fifo.OpenFifo(ctx, path, syscall.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open output fifo %s: %w", path, err)
	}
	i.keep = append(i.keep, r)
	return w, nil
}

// openFile opens a file:// destination for both stdout and stderr.
func (i *IO) openFile(path string, terminal bool) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("file stdio %q: %w: want an absolute path", path, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("file stdio: %w", err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("file stdio: %w", err)
	}
	// Each Write is one append(2): stdout and stderr interleave by write,
	// never inside one.
	i.stdout = f
	if !terminal {
		i.stderr = f
	}
	i.outputs = append(i.outputs, f)
	return nil
}

// Stdin is what the process reads, nil without stdin.
func (i *IO) Stdin() io.Reader {
	if i.stdin == nil {
		return nil
	}
	return i.stdin
}

// Stdout is where the process's output goes, nil without stdout.
func (i *IO) Stdout() io.Writer { return i.stdout }

// Stderr is where the process's errors go, nil without stderr (always nil
// with a terminal).
func (i *IO) Stderr() io.Writer { return i.stderr }

// CloseStdin releases the stdin fifo: a copy blocked reading it returns.
func (i *IO) CloseStdin() error {
	var err error
	i.closeStdinOnce.Do(func() {
		if i.stdin != nil {
			err = i.stdin.Close()
		}
	})
	return err
}

// CloseOutput ends the output: call it once everything the process wrote
// has been written here. Readers of fifos see EOF; a logging binary sees
// EOF on its pipes.
func (i *IO) CloseOutput() error {
	var errs []error
	i.closeOutputOnce.Do(func() {
		for _, c := range i.outputs {
			errs = append(errs, c.Close())
		}
	})
	return errors.Join(errs...)
}

// DropReaders closes the shim's own read sides of the output fifos. While
// a client reads, nothing changes; once none does, writes fail instead of
// blocking, so output nobody will read no longer holds the process's exit
// back. Safe to call more than once and concurrently with writes.
func (i *IO) DropReaders() {
	i.dropOnce.Do(func() {
		for _, c := range i.keep {
			_ = c.Close()
		}
	})
}

// Close releases everything and waits, within ctx, for a logging binary to
// finish with what it was given.
func (i *IO) Close(ctx context.Context) error {
	errs := []error{i.CloseStdin(), i.CloseOutput()}
	i.DropReaders()
	if i.logger != nil {
		errs = append(errs, i.logger.wait(ctx))
	}
	return errors.Join(errs...)
}
