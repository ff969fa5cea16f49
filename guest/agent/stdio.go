//go:build linux

package agent

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/api"
)

// copyBufSize bounds each read from a stream or a pipe. Under emulation
// every read and every yamux frame costs: 128 KiB reads from 128 KiB pipes
// move 100 MiB of output about a quarter faster than 32 KiB reads from
// the default 64 KiB pipes (`cocoon run -- dd if=/dev/zero bs=64k`, TCG).
const copyBufSize = 128 << 10

// outputPipeSize is the capacity of the pipes a process writes its output
// to: one full read of the copier.
const outputPipeSize = copyBufSize

// stdio is the agent's side of a process's standard streams: pipes (or a
// pty) towards the process, yamux streams towards the host, and the copiers
// between them.
type stdio struct {
	id       string
	terminal bool
	streams  streamSet
	// drainIdle bounds how long output is awaited after the process
	// exited while nothing arrives: a background child that keeps the
	// pipe open must not hold the exit status back forever.
	drainIdle time.Duration

	// child holds the process's ends, closed once it has started.
	child [3]*os.File
	// console is the pty master (terminal only).
	console *os.File
	// outputs are the agent's read ends: pipes, or the console.
	outputs []*os.File
	// exited is set once the process has exited; output copiers then
	// read with an idle deadline.
	exited atomic.Bool
	// outputWG counts running output copiers.
	outputWG sync.WaitGroup

	// stdinMu guards stdinW and stdinDone.
	stdinMu sync.Mutex
	// stdinW is the write end of the stdin pipe (not for terminals).
	stdinW *os.File
	// stdinDone is set once the stdin copier has ended.
	stdinDone bool
}

// newStdio creates the pipes or pty for a process. On error nothing is
// left open except streams, which the caller still owns.
func newStdio(req *api.StartProcessRequest, streams streamSet, drainIdle time.Duration) (_ *stdio, retErr error) {
	s := &stdio{id: req.Id, terminal: req.Terminal, streams: streams, drainIdle: drainIdle}
	defer func() {
		if retErr != nil {
			s.closeFiles()
		}
	}()
	if req.Terminal {
		master, slave, err := openPty()
		if err != nil {
			return nil, err
		}
		s.console = master
		s.child = [3]*os.File{slave, slave, slave}
		if err := setWinsize(master, req.Width, req.Height); err != nil {
			return nil, err
		}
		s.outputs = []*os.File{master}
		return s, nil
	}
	var devnull *os.File
	null := func() (*os.File, error) {
		if devnull == nil {
			f, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
			if err != nil {
				return nil, fmt.Errorf("open %s: %w", os.DevNull, err)
			}
			devnull = f
		}
		return devnull, nil
	}
	if streams[api.StreamStdin] != nil {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
		s.child[0], s.stdinW = r, w
	} else {
		f, err := null()
		if err != nil {
			return nil, err
		}
		s.child[0] = f
	}
	for i, kind := range []api.StreamKind{api.StreamStdout, api.StreamStderr} {
		if streams[kind] == nil {
			f, err := null()
			if err != nil {
				return nil, err
			}
			s.child[i+1] = f
			continue
		}
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("%s pipe: %w", kind, err)
		}
		growPipe(w)
		s.child[i+1] = w
		s.outputs = append(s.outputs, r)
	}
	return s, nil
}

// growPipe raises a pipe's capacity to outputPipeSize, so that a process
// writing much output runs ahead of the copier by a full read. Failing is
// harmless: the pipe keeps the kernel's default (64 KiB).
func growPipe(f *os.File) {
	if sc, err := f.SyscallConn(); err == nil {
		_ = sc.Control(func(fd uintptr) {
			_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, outputPipeSize)
		})
	}
}

// childFds are the descriptors for the child's fds 0, 1 and 2.
func (s *stdio) childFds() []uintptr {
	fds := make([]uintptr, 3)
	for i, f := range s.child {
		// Fd makes these blocking, which is what the child wants; the
		// agent's ends are separate files and stay in the poller.
		fds[i] = f.Fd()
	}
	return fds
}

// closeChild closes the process's ends after the fork, so that the agent
// sees EOF once the process (and whatever inherited them) is gone.
func (s *stdio) closeChild() {
	seen := map[*os.File]bool{}
	for i, f := range s.child {
		if f != nil && !seen[f] {
			seen[f] = true
			_ = f.Close()
		}
		s.child[i] = nil
	}
}

// closeFiles closes every file; used when the process never started.
func (s *stdio) closeFiles() {
	s.closeChild()
	for _, f := range s.outputs {
		_ = f.Close()
	}
	s.outputs = nil
	if s.console != nil {
		_ = s.console.Close()
	}
	s.stdinMu.Lock()
	if s.stdinW != nil {
		_ = s.stdinW.Close()
		s.stdinW = nil
	}
	s.stdinMu.Unlock()
}

// start launches the copiers; call once the process runs.
func (s *stdio) start() {
	if in := s.streams[api.StreamStdin]; in != nil {
		go s.copyStdin(in)
	} else {
		s.stdinMu.Lock()
		s.stdinDone = true
		s.stdinMu.Unlock()
	}
	if s.terminal {
		s.outputWG.Add(1)
		go s.copyOutput(s.console, s.streams[api.StreamStdout])
		return
	}
	i := 0
	for _, kind := range []api.StreamKind{api.StreamStdout, api.StreamStderr} {
		if st := s.streams[kind]; st != nil {
			s.outputWG.Add(1)
			go s.copyOutput(s.outputs[i], st)
			i++
		}
	}
}

func (s *stdio) copyStdin(in net.Conn) {
	var dst io.Writer
	if s.terminal {
		dst = s.console
	} else {
		dst = s.stdinW
	}
	buf := make([]byte, copyBufSize)
	_, _ = io.CopyBuffer(dst, readerOnly{in}, buf)
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	s.stdinDone = true
	// A terminal's stdin cannot be closed on its own: the master is its
	// output too. Pipes get EOF.
	if s.stdinW != nil {
		_ = s.stdinW.Close()
		s.stdinW = nil
	}
}

// closeStdin makes the process see EOF once what the host has sent so far
// is delivered. The host half-closes the stdin stream before asking, so
// everything it wrote is already buffered in the stream; the deadline
// only ends the copier's wait for more.
func (s *stdio) closeStdin() error {
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	if s.stdinDone {
		return nil
	}
	if in := s.streams[api.StreamStdin]; in != nil {
		return in.SetReadDeadline(time.Now())
	}
	return nil
}

func (s *stdio) resize(width, height uint32) error {
	if !s.terminal {
		return fmt.Errorf("process %s has no terminal: %w", s.id, errdefs.ErrFailedPrecondition)
	}
	return setWinsize(s.console, width, height)
}

// copyOutput copies src to dst (nil: discard) until EOF, or until nothing
// arrived for drainIdle after the process exited. It half-closes dst at
// the end so the host reads EOF.
func (s *stdio) copyOutput(src *os.File, dst net.Conn) {
	defer s.outputWG.Done()
	var w io.Writer = io.Discard
	if dst != nil {
		w = dst
	}
	buf := make([]byte, copyBufSize)
	for {
		if s.exited.Load() {
			_ = src.SetReadDeadline(time.Now().Add(s.drainIdle))
		}
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				// The host is gone; keep draining so the process
				// never blocks on a full pipe.
				w = io.Discard
			}
		}
		if err != nil {
			// EOF for pipes; EIO for a pty master once the last slave
			// is closed; a deadline when output idles after exit.
			break
		}
	}
	if dst != nil {
		_ = dst.Close()
	}
	if src != s.console {
		_ = src.Close()
	}
}

// processExited bounds the output drain and waits for it: the ordering
// rule is that a process's exit becomes visible only after its output was
// written to the host.
func (s *stdio) processExited() {
	s.exited.Store(true)
	for _, f := range s.outputs {
		_ = f.SetReadDeadline(time.Now().Add(s.drainIdle))
	}
	s.outputWG.Wait()
}

// release closes what remains once the exit status was collected.
func (s *stdio) release() {
	for _, c := range s.streams {
		// Close is a half-close; the deadline also ends a stdin copy
		// still waiting for the host.
		_ = c.SetDeadline(time.Now())
	}
	s.streams.closeAll()
	s.stdinMu.Lock()
	if s.stdinW != nil {
		_ = s.stdinW.Close()
		s.stdinW = nil
	}
	s.stdinMu.Unlock()
	if s.console != nil {
		_ = s.console.Close()
	}
}

// readerOnly hides a stream's WriteTo/ReadFrom so CopyBuffer uses the
// bounded buffer.
type readerOnly struct{ io.Reader }

// openPty opens a new pty pair. The master stays non-blocking so that it
// can be read with deadlines.
func openPty() (master, slave *os.File, retErr error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	defer func() {
		if retErr != nil {
			_ = master.Close()
		}
	}()
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	name := fmt.Sprintf("/dev/pts/%d", n)
	sfd, err := unix.Open(name, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", name, err)
	}
	return master, os.NewFile(uintptr(sfd), name), nil
}

// maxWinsize bounds terminal dimensions to what struct winsize holds.
const maxWinsize = 0xffff

func setWinsize(f *os.File, width, height uint32) error {
	if width > maxWinsize || height > maxWinsize {
		return fmt.Errorf("terminal size %dx%d over %d: %w", width, height, maxWinsize, errdefs.ErrInvalidArgument)
	}
	if width == 0 && height == 0 {
		return nil
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	ws := &unix.Winsize{Col: uint16(width), Row: uint16(height)}
	var ioErr error
	if err := sc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, ws)
	}); err != nil {
		return err
	}
	if ioErr != nil {
		return fmt.Errorf("set terminal size: %w", ioErr)
	}
	return nil
}
