// Package portfwd forwards the TCP connections made to the loopback of a
// sandbox's network namespace on the host into its guest.
//
// containerd's CRI serves a port-forward (kubectl port-forward, crictl
// port-forward) by entering the pod's network namespace on the host and
// dialing localhost:<port> there. A Cocoon pod's processes are in its
// guest, and nothing listens in that namespace. So the forwarder listens
// there, on 127.0.0.1 and (when the namespace has it) ::1, one port P per
// family, and an iptables nat OUTPUT rule of the namespace redirects
// every TCP connection to that loopback address, but to P itself, to P.
// For each connection it reads the port the client dialed
// (SO_ORIGINAL_DST) and asks the guest to connect to the same port of its
// own loopback, and splices the two. A connection to 127.0.0.1 that
// nothing in the guest takes is tried on the guest's ::1, as CRI tries
// tcp6 after tcp4.
//
// The rules are added and removed inside the namespace with the host's
// iptables and ip6tables (iptables-nft or legacy alike). Without them, or
// without a loopback address, a family is not forwarded; the sandbox runs
// all the same.
package portfwd

import (
	"context"
	"net"
	"time"
)

// Defaults for Options fields left zero.
const (
	// DefaultMaxConns bounds the connections forwarded at once.
	DefaultMaxConns = 64
	// DefaultDialTimeout bounds the guest's answer to a dial.
	DefaultDialTimeout = 10 * time.Second
	// DefaultIdle is how long a connection whose one direction has ended
	// waits for progress of the other.
	DefaultIdle = 30 * time.Second
)

// DialFunc connects to a TCP port of the guest's loopback: 127.0.0.1, or
// ::1 with ipv6. Nothing listening there is errdefs.ErrNotFound. Close on
// the connection it returns may be a half-close (a FIN), as on a stream
// of the agent session.
type DialFunc func(ctx context.Context, port uint16, ipv6 bool) (net.Conn, error)

// Options tune a Forwarder. Zero values take the defaults.
type Options struct {
	// MaxConns bounds the connections forwarded at once, from accept
	// to close; one more is closed as it arrives.
	MaxConns int
	// DialTimeout bounds each dial of the guest.
	DialTimeout time.Duration
	// Idle is how long a connection whose one direction has ended waits
	// for progress of the other before it is closed.
	Idle time.Duration
	// IPTables and IP6Tables are the commands that add and remove the
	// rules, names looked up in PATH or paths; "" is iptables and
	// ip6tables.
	IPTables, IP6Tables string
}

func (o Options) withDefaults() Options {
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.Idle <= 0 {
		o.Idle = DefaultIdle
	}
	if o.IPTables == "" {
		o.IPTables = "iptables"
	}
	if o.IP6Tables == "" {
		o.IP6Tables = "ip6tables"
	}
	return o
}
