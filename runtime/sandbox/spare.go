package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// A spare is a clone of a template started ahead of need: restored, its
// agent's session run once (so that under TCG its code is translated in
// that QEMU), parked in its handshake and paused. It waits, held by a
// `cocoon template spare` process, for the first sandbox of its shape,
// whose start takes the running QEMU over instead of launching one: a
// start from a spare pays neither QEMU's start nor the state's load nor
// the first run of the agent's code, and gives the guest its identity
// (clock, entropy, hostname) as every start does before anything of the
// sandbox runs in it. One spare per shape at most: the spare process
// holds <state_dir>/cocoon.spares/<key>.lock and serves claims on
// <key>.sock beside it; its VM's state directory is a sandbox's of
// namespace SpareNamespace, moved to the claiming sandbox's place.

// SpareNamespace is the namespace of spares' VMs, and the directory under
// runtime.state_dir of their locks and claim sockets.
const SpareNamespace = "cocoon.spares"

// ErrSpareRunning is RunSpare's error when a spare of the shape is
// already there (or being made).
var ErrSpareRunning = errors.New("a spare of this shape is already there")

// spareCheckEvery is how often a waiting spare checks that its template
// is still there and valid, and ends itself when it is not.
const spareCheckEvery = 30 * time.Second

// spareIOTimeout bounds one exchange on a spare's claim socket.
const spareIOTimeout = 5 * time.Second

// Operations on a spare's claim socket.
const (
	spareClaim = "claim"
	spareStop  = "stop"
)

// spareRequest is what a claim socket reads: one message.
type spareRequest struct {
	Op  string `json:"op"`
	Key string `json:"key"`
}

// spareReply answers it; a claim's carries the VM's files.
type spareReply struct {
	Handoff *hypervisor.Handoff `json:"handoff,omitempty"`
	// AgentConn says the last file is the parked agent connection
	// (virtio-serial); on vsock the claimer dials the guest.
	AgentConn bool   `json:"agent_conn,omitempty"`
	Error     string `json:"error,omitempty"`
}

// SparePaths are the lock and claim socket of key's spare under
// stateDir.
func SparePaths(stateDir, key string) (lock, sock string) {
	dir := filepath.Join(stateDir, SpareNamespace)
	return filepath.Join(dir, key+".lock"), filepath.Join(dir, key+".sock")
}

// SpareOptions are what RunSpare needs besides the sandbox's options.
type SpareOptions struct {
	// Key is the shape's key, which o must have.
	Key string
	// Ready, if set, is called once the spare waits for a claim.
	Ready func(dir string)
}

// RunSpare makes the spare of o's shape from its template in store and
// serves it: it returns once a sandbox has claimed it (its VM is then
// that sandbox's), once it is asked to stop or ctx ends (its VM is then
// stopped), or when its template is no longer valid or its VM dies. It
// fails with ErrSpareRunning if another spare of the shape is there.
func RunSpare(ctx context.Context, o Options, store *template.Store, so SpareOptions) error {
	lockPath, sockPath := SparePaths(o.Config.Runtime.StateDir, so.Key)
	lock, err := openSpareLock(lockPath)
	if err != nil {
		return err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		lock.Close()
		return ErrSpareRunning
	} else if err != nil {
		lock.Close()
		return fmt.Errorf("spare lock: %w", err)
	}
	// Removed while held: a spare process that opened the file before
	// then takes a lock nobody looks at, and finds its socket path
	// taken (below).
	unlock := sync.OnceFunc(func() {
		_ = os.Remove(lockPath)
		lock.Close()
		// The directory goes with the last spare: Remove fails while
		// another spare's files are in it.
		_ = os.Remove(filepath.Dir(lockPath))
	})
	defer unlock()
	shape, err := ShapeOf(o)
	if err != nil {
		return err
	}
	if shape.Key() != so.Key {
		return fmt.Errorf("the spare asked for has key %s, this configuration's is %s: the configuration changed: %w", so.Key, shape.Key(), errdefs.ErrFailedPrecondition)
	}
	t, err := store.Lookup(shape)
	if err != nil {
		return fmt.Errorf("the template of the spare: %w", err)
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	o.Namespace, o.ID = SpareNamespace, "spare-"+so.Key+"-"+hex.EncodeToString(id[:])
	o.Template, o.unwatched = t, true
	lg := log.G(ctx).WithField("key", so.Key).WithField("sandbox", o.ID)
	began := time.Now()
	sb, err := Start(ctx, o)
	if err != nil {
		return fmt.Errorf("start the spare: %w", err)
	}
	parked, err := sb.park(ctx)
	if err != nil {
		_ = sb.Stop(context.WithoutCancel(ctx))
		return err
	}
	stop := func(why string) {
		lg.WithField("reason", why).Info("stopping the spare")
		if parked != nil {
			parked.Close()
		}
		if err := sb.Stop(context.WithoutCancel(ctx)); err != nil {
			lg.WithError(err).Warn("stop the spare")
		}
	}
	// Bound once the spare is ready, so that a start never waits for a
	// spare being made: it finds no socket and starts a clone. Bound while
	// the lock is held: a socket there is a dead spare's.
	_ = os.Remove(sockPath)
	ln, err := channel.ListenUnix("unixpacket", sockPath)
	if err != nil {
		stop("its claim socket cannot be made")
		return fmt.Errorf("spare claim socket: %w", err)
	}
	sockID, err := os.Stat(sockPath)
	if err != nil {
		ln.Close()
		stop("its claim socket cannot be made")
		return fmt.Errorf("spare claim socket: %w", err)
	}
	// ours says whether the socket path is still this spare's: another
	// spare of the key that bound it in its place makes this one
	// unreachable.
	ours := func() bool {
		fi, err := os.Stat(sockPath)
		return err == nil && os.SameFile(fi, sockID)
	}
	// release ends the spare's hold on its key: once its VM is handed
	// over (before the reply, so that the spare the claimer's start
	// makes next finds the key free), or when it ends.
	release := sync.OnceFunc(func() {
		ln.Close()
		if ours() {
			_ = os.Remove(sockPath)
		}
		unlock()
	})
	defer release()

	lg.WithField("ready_ms", sb.ReadyIn.Milliseconds()).WithField("made_ms", time.Since(began).Milliseconds()).Info("spare ready")
	if so.Ready != nil {
		so.Ready(sb.Dir)
	}

	conns := make(chan *net.UnixConn)
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				close(conns)
				return
			}
			select {
			case conns <- c:
			case <-ctx.Done():
				c.Close()
			}
		}
	}()
	tick := time.NewTicker(spareCheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			stop("asked to end")
			return nil
		case <-sb.vm.Exited():
			err := sb.vmEndCause()
			stop("its vm ended")
			return fmt.Errorf("the spare's vm ended: %w", err)
		case <-tick.C:
			if !ours() {
				stop("its claim socket is another spare's")
				return nil
			}
			cur, err := store.Lookup(shape)
			if err == nil && cur.Manifest.Created.Equal(t.Manifest.Created) {
				continue
			}
			if err == nil {
				err = errors.New("it was made again")
			}
			stop("its template is no longer the one it was made from: " + err.Error())
			return nil
		case c, ok := <-conns:
			if !ok {
				stop("its claim socket closed")
				return errors.New("the spare's claim socket closed")
			}
			done, err := sb.serveSpare(ctx, c, so.Key, parked, stop, release)
			c.Close()
			if err != nil {
				lg.WithError(err).Warn("a spare claim failed")
			}
			if done {
				return err
			}
		}
	}
}

// openSpareLock opens (making it) a spare's lock file. The directory of
// spares goes with the last spare, maybe between making it and opening
// the file: then it is made again.
func openSpareLock(path string) (*os.File, error) {
	for try := 0; ; try++ {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("spares: %w", err)
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err == nil || !errors.Is(err, os.ErrNotExist) || try == 2 {
			if err != nil {
				return nil, fmt.Errorf("spare lock: %w", err)
			}
			return f, nil
		}
	}
}

// park parks the agent of a spare's guest as a template's is saved
// (parkAgent), and pauses the VM. The parked connection (virtio-serial)
// is returned: the claim hands it over.
func (s *Sandbox) park(ctx context.Context) (net.Conn, error) {
	raw, err := s.parkAgent(ctx)
	if err != nil {
		return nil, fmt.Errorf("the spare's guest: %w", err)
	}
	snap, ok := s.vm.(hypervisor.Snapshotter)
	if !ok {
		err = fmt.Errorf("spares: the hypervisor driver cannot pause a VM: %w", errdefs.ErrNotImplemented)
	} else if err = snap.Pause(ctx); err != nil {
		err = fmt.Errorf("pause the spare: %w", err)
	}
	if err != nil {
		if raw != nil {
			raw.Close()
		}
		return nil, err
	}
	return raw, nil
}

// serveSpare answers one request on the claim socket. done says the
// spare is over: claimed (its VM handed over) or stopped.
func (s *Sandbox) serveSpare(ctx context.Context, c *net.UnixConn, key string, parked net.Conn, stop func(string), release func()) (done bool, _ error) {
	_ = c.SetDeadline(time.Now().Add(spareIOTimeout))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return false, fmt.Errorf("read a claim: %w", err)
	}
	var req spareRequest
	if err := json.Unmarshal(buf[:n], &req); err != nil {
		return false, fmt.Errorf("a claim that is not json: %w", err)
	}
	reply := func(r spareReply, files []*os.File) error {
		data, err := json.Marshal(r)
		if err != nil {
			return err
		}
		return writeWithFiles(c, data, files)
	}
	switch {
	case req.Key != key:
		return false, reply(spareReply{Error: fmt.Sprintf("this spare is of template %s, not %s", key, req.Key)}, nil)
	case req.Op == spareStop:
		stop("asked to stop")
		return true, reply(spareReply{}, nil)
	case req.Op != spareClaim:
		return false, reply(spareReply{Error: fmt.Sprintf("unknown operation %q", req.Op)}, nil)
	}
	d, ok := s.vm.(hypervisor.Detacher)
	if !ok {
		stop("its driver cannot hand a VM over")
		return true, reply(spareReply{Error: "the hypervisor driver cannot hand a VM over"}, nil)
	}
	h, files, err := d.Detach()
	if err != nil {
		stop("it could not be handed over")
		return true, errors.Join(err, reply(spareReply{Error: err.Error()}, nil))
	}
	r := spareReply{Handoff: &h}
	if parked != nil {
		pf, err := parked.(*net.UnixConn).File()
		if err != nil {
			closeFiles(files)
			stop("its agent connection could not be handed over")
			return true, err
		}
		files = append(files, pf)
		r.AgentConn = true
	}
	release()
	err = reply(r, files)
	closeFiles(files)
	if parked != nil {
		parked.Close()
	}
	if err != nil {
		// The claimer went away: nobody has the VM. It is ended by its
		// state directory, which has its pid and name.
		if cerr := s.vm.Stop(context.WithoutCancel(ctx)); cerr != nil {
			err = errors.Join(err, cerr)
		}
		_ = os.RemoveAll(s.Dir)
		return true, fmt.Errorf("hand the spare over: %w", err)
	}
	log.G(ctx).WithField("sandbox", s.ID).WithField("pid", h.PID).Info("spare claimed")
	return true, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// StopSpare asks the spare of key under stateDir to stop, if one runs,
// and waits for it to have stopped its VM. It says whether one did.
func StopSpare(ctx context.Context, stateDir, key string) (bool, error) {
	c, err := askSpare(ctx, stateDir, key, spareStop, 2*spareIOTimeout)
	if c == nil || err != nil {
		return false, err
	}
	defer c.Close()
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return false, fmt.Errorf("stop the spare of %s: %w", key, err)
	}
	var r spareReply
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		return false, fmt.Errorf("the spare of %s answered what cannot be read: %w", key, err)
	}
	if r.Error != "" {
		return false, fmt.Errorf("the spare of %s: %s", key, r.Error)
	}
	return true, nil
}

// SpareHeld says whether a spare process holds key's spare lock under
// stateDir: a spare of key is being made, waits or is being claimed.
func SpareHeld(stateDir, key string) bool {
	lockPath, _ := SparePaths(stateDir, key)
	f, err := os.Open(lockPath)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	return false
}

// SpareWaits says whether the spare of key under stateDir waits for a
// claim: its process holds the key and serves its socket.
func SpareWaits(stateDir, key string) bool {
	_, sock := SparePaths(stateDir, key)
	_, err := os.Stat(sock)
	return err == nil && SpareHeld(stateDir, key)
}

// SpareDir is the state directory of the VM of key's spare under
// stateDir, "" unless there is exactly one (a spare's VM that a sandbox
// took over has moved to the sandbox's).
func SpareDir(stateDir, key string) string {
	dirs, _ := filepath.Glob(filepath.Join(stateDir, SpareNamespace, "spare-"+key+"-*"))
	if len(dirs) != 1 {
		return ""
	}
	return dirs[0]
}

// EndSpare stops the spare of key under stateDir, if there is one, and
// returns once no spare process holds the key. A spare being made is
// waited for and stopped once it waits (it answers no request before).
func EndSpare(ctx context.Context, stateDir, key string) error {
	for SpareHeld(stateDir, key) {
		if _, err := StopSpare(ctx, stateDir, key); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the spare of %s did not stop: %w", key, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// SpareKeyOf is the template key of a spare's sandbox id, "" if id is not
// a spare's.
func SpareKeyOf(id string) string {
	rest, ok := strings.CutPrefix(id, "spare-")
	if !ok {
		return ""
	}
	key, _, ok := strings.Cut(rest, "-")
	if !ok || template.ValidKey(key) != nil {
		return ""
	}
	return key
}

// writeWithFiles writes data as one message on c, with files' descriptors
// (SCM_RIGHTS).
func writeWithFiles(c *net.UnixConn, data []byte, files []*os.File) error {
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	_, _, err := c.WriteMsgUnix(data, oob, nil)
	return err
}
