//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/hashicorp/yamux"
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
// between them. The streams towards the host are hostEnds: when the
// session they came in on ends, the copiers wait for AttachProcess to hand
// them streams of a new session, holding what they could not deliver.
type stdio struct {
	id       string
	terminal bool
	// ends are the streams towards the host by kind, one for each kind
	// the process was started with; the map is not changed after
	// newStdio.
	ends map[api.StreamKind]*hostEnd
	stdioTimes

	// released is closed by release: from then on no copier waits for
	// a stream.
	released    chan struct{}
	releaseOnce sync.Once

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

// stdioTimes are the bounds of a process's stdio, from Config.
type stdioTimes struct {
	// drainIdle bounds how long output is awaited after the process
	// exited while nothing arrives: a background child that keeps the
	// pipe open must not hold the exit status back forever.
	drainIdle time.Duration
	// reattachTimeout bounds a copier's wait for AttachProcess once its
	// stream failed because the session it came in on ended.
	reattachTimeout time.Duration
}

func (s *Service) stdioTimes() stdioTimes {
	return stdioTimes{drainIdle: s.cfg.OutputDrainIdle, reattachTimeout: s.cfg.ReattachTimeout}
}

// newStdioEnds returns a process's stdio with a hostEnd for each stream
// in streams, and no files yet.
func newStdioEnds(id string, terminal bool, streams streamSet, times stdioTimes) *stdio {
	s := &stdio{id: id, terminal: terminal, stdioTimes: times, ends: make(map[api.StreamKind]*hostEnd, len(streams)), released: make(chan struct{})}
	for kind, conn := range streams {
		s.ends[kind] = newHostEnd(kind, conn)
	}
	return s
}

// newStdio creates the pipes or pty for a process. On error nothing is
// left open except streams, which the caller still owns.
func newStdio(req *api.StartProcessRequest, streams streamSet, times stdioTimes) (_ *stdio, retErr error) {
	s := newStdioEnds(req.Id, req.Terminal, streams, times)
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

// start launches the copiers; call once the process runs. ctx carries
// the logger of the call that started it.
func (s *stdio) start(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	if in := s.ends[api.StreamStdin]; in != nil {
		var dst io.Writer = s.stdinW
		if s.terminal {
			dst = s.console
		}
		go s.copyStdin(ctx, in, dst)
	} else {
		s.stdinMu.Lock()
		s.stdinDone = true
		s.stdinMu.Unlock()
	}
	if s.terminal {
		s.outputWG.Add(1)
		go s.copyOutput(ctx, s.console, s.ends[api.StreamStdout])
		return
	}
	i := 0
	for _, kind := range []api.StreamKind{api.StreamStdout, api.StreamStderr} {
		if e := s.ends[kind]; e != nil {
			s.outputWG.Add(1)
			go s.copyOutput(ctx, s.outputs[i], e)
			i++
		}
	}
}

// copyStdin copies what the host sends on in's stream to dst (the stdin
// pipe or the console) until the host half-closes it, CloseStdin, or the
// process stops reading; then a pipe is closed, so the process reads EOF.
// A stream whose session ended is awaited again (see recover).
func (s *stdio) copyStdin(ctx context.Context, in *hostEnd, dst io.Writer) {
	buf := make([]byte, copyBufSize)
	for {
		a := in.current()
		if a.conn == nil {
			break
		}
		n, err := a.conn.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				// The process closed its stdin, or is gone.
				break
			}
		}
		if err != nil {
			s.recover(ctx, in, a, err)
		}
	}
	in.finishInput()
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
	if in := s.ends[api.StreamStdin]; in != nil {
		return in.askClose()
	}
	return nil
}

func (s *stdio) resize(width, height uint32) error {
	if !s.terminal {
		return fmt.Errorf("process %s has no terminal: %w", s.id, errdefs.ErrFailedPrecondition)
	}
	return setWinsize(s.console, width, height)
}

// copyOutput copies src to out's stream (nil: discard) until EOF, or
// until nothing arrived for drainIdle after the process exited. It
// half-closes the stream at the end so the host reads EOF.
func (s *stdio) copyOutput(ctx context.Context, src *os.File, out *hostEnd) {
	defer s.outputWG.Done()
	buf := make([]byte, copyBufSize)
	for {
		if s.exited.Load() {
			_ = src.SetReadDeadline(time.Now().Add(s.drainIdle))
		}
		n, err := src.Read(buf)
		if n > 0 {
			s.send(ctx, out, buf[:n])
		}
		if err != nil {
			// EOF for pipes; EIO for a pty master once the last slave
			// is closed; a deadline when output idles after exit.
			break
		}
	}
	if out != nil {
		out.finish()
	}
	if src != s.console {
		_ = src.Close()
	}
}

// send writes b to out's stream. What a failed write left unwritten goes
// to the stream that replaces it, when one does (see recover); without one
// it is discarded, and so is what follows until an AttachProcess. The pipe
// is not read meanwhile. The frame a write was waiting on when its
// session ended counts as unwritten (yamux answers ErrSessionShutdown
// whether or not it went out): it goes again to the new stream, at least
// once rather than at most.
func (s *stdio) send(ctx context.Context, out *hostEnd, b []byte) {
	if out == nil {
		return
	}
	for len(b) > 0 {
		a := out.current()
		if a.conn == nil {
			return
		}
		n, err := a.conn.Write(b)
		b = b[n:]
		if err != nil {
			s.recover(ctx, out, a, err)
		}
	}
}

// recover settles what follows the failure of e's stream a, after which
// the copier goes on with e's current stream (detached: nil):
//
//   - a was replaced meanwhile (AttachProcess): with its replacement.
//   - CloseStdin was asked for: detached, so stdin reads EOF.
//   - a's session ended: with the stream an AttachProcess brings within
//     reattachTimeout; detached if none does, or the process is released.
//   - the host ended a (half-closed or reset it) in a session that goes
//     on: detached, as it always was.
func (s *stdio) recover(ctx context.Context, e *hostEnd, a attached, err error) {
	if e.replacedSince(a.gen) {
		return
	}
	if e.closeRequested() {
		e.detach(a.gen)
		return
	}
	if !sessionOver(a, err) {
		e.detach(a.gen)
		return
	}
	lg := log.G(ctx).WithField("process", s.id).WithField("stream", e.kind.String())
	lg.WithError(err).Info("the session of a stdio stream ended; waiting for AttachProcess")
	if e.await(a.gen, s.reattachTimeout, s.released) {
		lg.Info("stdio stream reattached")
		return
	}
	if e.detach(a.gen) {
		lg.WithField("timeout", s.reattachTimeout).Warn("no stdio stream reattached in time; detaching it")
	}
}

// sessionEndGrace is how long a stream that failed in its session's
// connection (not in itself) waits for the session to be seen ended:
// yamux reports such a failure to the writer just before it ends the
// session.
const sessionEndGrace = time.Second

// sessionOver reports whether stream a failed because the session it came
// in on ended, rather than because the host or the agent ended the stream
// itself while the session goes on.
func sessionOver(a attached, err error) bool {
	if a.sessionEnd == nil {
		return false
	}
	select {
	case <-a.sessionEnd:
		return true
	default:
	}
	if streamFailure(err) {
		return false
	}
	t := time.NewTimer(sessionEndGrace)
	defer t.Stop()
	select {
	case <-a.sessionEnd:
		return true
	case <-t.C:
		return false
	}
}

// streamFailure reports whether err ends one stream of a session and
// not the session: the host half-closed (EOF) or reset the stream, or the
// agent closed it or ended a wait with a deadline. A session that ends
// fails its streams with these too, but it is seen ended first.
func streamFailure(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, yamux.ErrConnectionReset) || errors.Is(err, yamux.ErrStreamClosed) ||
		errors.Is(err, yamux.ErrTimeout) || errors.Is(err, os.ErrDeadlineExceeded)
}

// processExited bounds the output drain and waits for it: the ordering
// rule is that a process's exit becomes visible only after its output was
// written to the host. A copier waiting for AttachProcess holds the exit
// back until it is reattached or gives up; drainIdle bounds only the
// reads of the pipes.
func (s *stdio) processExited() {
	s.exited.Store(true)
	for _, f := range s.outputs {
		_ = f.SetReadDeadline(time.Now().Add(s.drainIdle))
	}
	s.outputWG.Wait()
}

// wantedStreams checks that the process has each kind AttachProcess asks
// for and lists them.
func (s *stdio) wantedStreams(stdin, stdout, stderr bool) ([]api.StreamKind, error) {
	var want []api.StreamKind
	for _, k := range []struct {
		kind  api.StreamKind
		asked bool
	}{{api.StreamStdin, stdin}, {api.StreamStdout, stdout}, {api.StreamStderr, stderr}} {
		if !k.asked {
			continue
		}
		if s.ends[k.kind] == nil {
			if s.terminal && k.kind == api.StreamStderr {
				return nil, fmt.Errorf("process %s has a terminal: its output is on stdout, there is no stderr stream to attach: %w", s.id, errdefs.ErrInvalidArgument)
			}
			return nil, fmt.Errorf("process %s was started without a %s stream (it has /dev/null there): there is none to attach: %w", s.id, k.kind, errdefs.ErrInvalidArgument)
		}
		want = append(want, k.kind)
	}
	return want, nil
}

// errReleased is attach's error once the process was waited for.
var errReleased = errors.New("the process's stdio was released")

// attach hands the process's stdio to streams: each kind there replaces
// the stream of its hostEnd, whose copier goes on with it; every other
// kind is detached (output discarded, stdin at EOF). The caller still
// owns streams if it fails.
func (s *stdio) attach(streams streamSet) error {
	select {
	case <-s.released:
		return errReleased
	default:
	}
	for kind, e := range s.ends {
		e.replace(streams[kind])
	}
	return nil
}

// release closes what remains once the exit status was collected.
func (s *stdio) release() {
	s.releaseOnce.Do(func() { close(s.released) })
	for _, e := range s.ends {
		e.drop()
	}
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

// hostEnd is one of a process's stdio streams towards the host as its
// copier sees it: the stream attached now, which AttachProcess may
// replace with one of another session.
type hostEnd struct {
	kind api.StreamKind

	// mu guards the fields below. No I/O is done under it but the
	// setting of deadlines.
	mu sync.Mutex
	// cur is the stream attached now; cur.conn is nil while detached.
	cur attached
	// swapped is closed, and made anew, each time cur changes.
	swapped chan struct{}
	// finished is set once the copier has ended: a stream attached
	// later is closed at once, so that its host reads EOF.
	finished bool
	// closing is set by CloseStdin (stdin only): the copy ends at the
	// next failed read, once what the host sent is delivered.
	closing bool
	// closeAsked is closed when closing is set.
	closeAsked chan struct{}
}

// attached is a stream of a hostEnd.
type attached struct {
	// conn is the stream; nil: none (output is discarded, stdin is at
	// EOF).
	conn net.Conn
	// sessionEnd is closed when the session conn came in on ends; nil
	// when there is none to tell.
	sessionEnd <-chan struct{}
	// gen numbers the streams of one hostEnd: a copier whose stream
	// failed tells by it whether the stream was replaced meanwhile.
	gen uint64
}

func newHostEnd(kind api.StreamKind, conn net.Conn) *hostEnd {
	return &hostEnd{
		kind:       kind,
		cur:        attached{conn: conn, sessionEnd: sessionEnd(conn)},
		swapped:    make(chan struct{}),
		closeAsked: make(chan struct{}),
	}
}

// current returns the stream attached now.
func (e *hostEnd) current() attached {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur
}

// setLocked makes conn the current stream and returns the one it
// replaces.
func (e *hostEnd) setLocked(conn net.Conn) net.Conn {
	old := e.cur.conn
	e.cur = attached{conn: conn, sessionEnd: sessionEnd(conn), gen: e.cur.gen + 1}
	close(e.swapped)
	e.swapped = make(chan struct{})
	return old
}

// replace attaches conn (nil: detaches) in place of the current stream,
// which is closed: a copier blocked on it fails and goes on with conn.
func (e *hostEnd) replace(conn net.Conn) {
	e.mu.Lock()
	if e.finished {
		e.mu.Unlock()
		if conn != nil {
			_ = conn.Close()
		}
		return
	}
	if e.closing && conn != nil {
		// What the new host sends before the close is still read.
		_ = conn.SetReadDeadline(time.Now())
	}
	old := e.setLocked(conn)
	e.mu.Unlock()
	dropStream(old)
}

// detach drops stream generation gen, if it is still current, and
// reports whether it was.
func (e *hostEnd) detach(gen uint64) bool {
	e.mu.Lock()
	if e.cur.gen != gen {
		e.mu.Unlock()
		return false
	}
	old := e.setLocked(nil)
	e.mu.Unlock()
	dropStream(old)
	return true
}

// replacedSince reports whether the stream of generation gen is no
// longer current.
func (e *hostEnd) replacedSince(gen uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur.gen != gen
}

// await waits until the stream of generation gen is replaced, at most
// timeout, and not past done or a CloseStdin, and reports whether it was.
func (e *hostEnd) await(gen uint64, timeout time.Duration, done <-chan struct{}) bool {
	e.mu.Lock()
	if e.cur.gen != gen {
		e.mu.Unlock()
		return true
	}
	swapped, closeAsked := e.swapped, e.closeAsked
	e.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-swapped:
		return true
	case <-t.C:
	case <-done:
	case <-closeAsked:
	}
	return false
}

// askClose has the stdin copy end once what the host sent is delivered:
// the deadline ends its wait for more.
func (e *hostEnd) askClose() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.closing {
		e.closing = true
		close(e.closeAsked)
	}
	if e.cur.conn != nil {
		return e.cur.conn.SetReadDeadline(time.Now())
	}
	return nil
}

func (e *hostEnd) closeRequested() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closing
}

// finish is the end of an output copier: the stream is half-closed, so
// that the host reads EOF, and streams attached later are closed at once.
func (e *hostEnd) finish() {
	e.mu.Lock()
	e.finished = true
	old := e.setLocked(nil)
	e.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
}

// finishInput is the end of the stdin copier: streams attached later are
// closed at once. The stream itself stays open until release, so that
// what the host still sends waits in its window (a closed stream would
// have the session discard it, warning at every frame).
func (e *hostEnd) finishInput() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.finished = true
}

// drop closes the stream for good, ending a copier's wait on it.
func (e *hostEnd) drop() {
	e.mu.Lock()
	e.finished = true
	old := e.setLocked(nil)
	e.mu.Unlock()
	dropStream(old)
}

// dropStream closes a stream no copier is to use again; the deadline
// ends a Read or Write blocked on it (Close alone is a half-close).
func dropStream(c net.Conn) {
	if c == nil {
		return
	}
	_ = c.SetDeadline(time.Now())
	_ = c.Close()
}

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
