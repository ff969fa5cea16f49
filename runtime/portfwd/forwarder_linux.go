package portfwd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/guest/api"
)

// acceptPause is how long an accept loop waits after an error that is not
// its listener's close (out of descriptors), so that it cannot spin.
const acceptPause = 100 * time.Millisecond

// Forwarder forwards the connections made to the loopback of one network
// namespace into a guest, until Close.
type Forwarder struct {
	// path is the namespace's path, for messages; ns holds the namespace
	// open for as long as the forwarder lives, so that its rules are
	// removed whatever became of path, and nsPath enters it through ns.
	path   string
	ns     *os.File
	nsPath string
	dial   DialFunc
	opts   Options
	log    *log.Entry
	// families are the forwarded ones, IPv4 first.
	families []*family
	// slots bounds the connections forwarded at once (opts.MaxConns).
	slots chan struct{}
	// ctx ends the dials in flight at Close.
	ctx    context.Context
	cancel context.CancelFunc
	// wg counts the accept loops and the connections being forwarded.
	wg sync.WaitGroup

	// mu guards conns and closed.
	mu sync.Mutex
	// conns are the connections being forwarded: each client's, and
	// its guest's once dialed.
	conns  map[*forwarded]struct{}
	closed bool

	closeOnce sync.Once
	closeErr  error
}

// forwarded is one connection: the client's, and the guest's once dialed.
type forwarded struct {
	client *net.TCPConn
	guest  net.Conn
}

// Start forwards the TCP connections made to the loopback of the network
// namespace at path into the guest that dial reaches. It forwards the
// families it can and logs, through ctx's logger, why it leaves out the
// others (no iptables or ip6tables, no ::1); it fails, leaving nothing,
// only when it can forward neither. ctx is not kept.
func Start(ctx context.Context, path string, dial DialFunc, o Options) (_ *Forwarder, retErr error) {
	ns, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("port forwarding: network namespace %s: %w", path, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("port forwarding: network namespace %s: %w", path, err)
	}
	o = o.withDefaults()
	f := &Forwarder{
		path: path, ns: ns, nsPath: fmt.Sprintf("/proc/self/fd/%d", ns.Fd()),
		dial: dial, opts: o, log: log.G(ctx).WithField("netns", path),
		slots: make(chan struct{}, o.MaxConns),
		conns: make(map[*forwarded]struct{}),
	}
	f.ctx, f.cancel = context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		if retErr != nil {
			_ = f.Close()
		}
	}()
	var skipped []error
	for _, fam := range []*family{{}, {ipv6: true}} {
		cmd := o.IPTables
		if fam.ipv6 {
			cmd = o.IP6Tables
		}
		if err := fam.setUp(f.nsPath, cmd); err != nil {
			skipped = append(skipped, fmt.Errorf("%s: %w", fam, err))
			l := f.log.WithError(err)
			if fam.ipv6 && errors.Is(err, errNoLoopback) {
				// A namespace without IPv6 is common, and nothing is lost.
				l.Debugf("port forwarding of the namespace's %s loopback into the guest is off", fam)
				continue
			}
			l.Warnf("port forwarding of the namespace's %s loopback into the guest is off", fam)
			continue
		}
		f.families = append(f.families, fam)
	}
	if len(f.families) == 0 {
		return nil, fmt.Errorf("port forwarding: network namespace %s: %w", path, errors.Join(skipped...))
	}
	for _, fam := range f.families {
		f.wg.Add(1)
		go f.accept(fam)
	}
	return f, nil
}

// Port is the port of the listener on the namespace's ::1 with ipv6, else
// on its 127.0.0.1; 0 when that family is not forwarded.
func (f *Forwarder) Port(ipv6 bool) int {
	for _, fam := range f.families {
		if fam.ipv6 == ipv6 {
			return fam.ln.Addr().(*net.TCPAddr).Port
		}
	}
	return 0
}

// accept forwards the connections of fam's listener until it is closed.
func (f *Forwarder) accept(fam *family) {
	defer f.wg.Done()
	for {
		c, err := fam.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			f.log.WithError(err).Warn("port forwarding: accept")
			time.Sleep(acceptPause)
			continue
		}
		select {
		case f.slots <- struct{}{}:
		default:
			f.log.WithField("max_conns", f.opts.MaxConns).Warn("port forwarding: too many connections; closing one")
			_ = c.Close()
			continue
		}
		fw := &forwarded{client: c}
		if !f.track(fw) {
			<-f.slots
			_ = c.Close()
			return
		}
		go f.forward(fw, fam)
	}
}

// track records fw, and counts its forwarding in wg, unless the
// forwarder is closed.
func (f *Forwarder) track(fw *forwarded) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[fw] = struct{}{}
	f.wg.Add(1)
	return true
}

// forward dials the guest for fw's client and splices the two.
func (f *Forwarder) forward(fw *forwarded, fam *family) {
	defer f.wg.Done()
	defer func() { <-f.slots }()
	defer f.untrack(fw)
	port, err := originalPort(fw.client, fam.ipv6)
	if err != nil {
		f.log.WithError(err).Warn("port forwarding: cannot tell the port a connection was made to")
		_ = fw.client.Close()
		return
	}
	logger := f.log.WithField("port", port).WithField("family", fam.String())
	g, err := f.dialGuest(port, fam.ipv6)
	if err != nil {
		logger.WithError(err).Debug("port forwarding: the guest did not connect")
		_ = fw.client.Close()
		return
	}
	if !f.attach(fw, g) {
		_ = g.Close()
		_ = fw.client.Close()
		return
	}
	in, out, err := api.Splice(fw.client, g, f.opts.Idle)
	logger.WithError(err).WithField("bytes_in", in).WithField("bytes_out", out).Debug("port forwarding: connection ended")
}

// dialGuest connects to port on the guest's loopback of the family,
// and for IPv4, when nothing listens there, on its ::1: CRI dials
// localhost with tcp4 and then with tcp6, and the rule takes the first.
func (f *Forwarder) dialGuest(port uint16, ipv6 bool) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(f.ctx, f.opts.DialTimeout)
	defer cancel()
	g, err := f.dial(ctx, port, ipv6)
	if err != nil && !ipv6 && errdefs.IsNotFound(err) {
		var err6 error
		if g, err6 = f.dial(ctx, port, true); err6 == nil {
			return g, nil
		}
	}
	return g, err
}

// attach records the guest's connection of fw, unless the forwarder was
// closed meanwhile.
func (f *Forwarder) attach(fw *forwarded, g net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	fw.guest = g
	return true
}

func (f *Forwarder) untrack(fw *forwarded) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, fw)
}

// Close stops forwarding: it closes the listeners and every connection
// being forwarded, and removes the rules from the namespace. Safe to
// call more than once; later calls return the first one's result.
func (f *Forwarder) Close() error {
	f.closeOnce.Do(func() {
		f.cancel()
		f.mu.Lock()
		f.closed = true
		conns := f.conns
		f.conns = nil
		f.mu.Unlock()
		for _, fam := range f.families {
			_ = fam.ln.Close()
		}
		for fw := range conns {
			_ = fw.client.Close()
			if fw.guest != nil {
				// A stream's Close is a half-close: the deadline ends
				// its reads and writes.
				_ = fw.guest.SetDeadline(time.Now())
				_ = fw.guest.Close()
			}
		}
		f.wg.Wait()
		// After the connections' ends: their last segments are
		// translated by the rules' NAT.
		var errs []error
		for _, fam := range f.families {
			if err := fam.remove(f.nsPath); err != nil {
				errs = append(errs, fmt.Errorf("port forwarding: network namespace %s: %s: %w", f.path, fam, err))
			}
		}
		_ = f.ns.Close()
		f.closeErr = errors.Join(errs...)
	})
	return f.closeErr
}
