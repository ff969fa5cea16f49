package sandbox

import (
	"context"
	"fmt"
	"net"

	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/portfwd"
)

// DialGuestPort connects to a TCP port of the guest's loopback (127.0.0.1,
// or ::1 with ipv6), in the network namespace the sandbox's containers
// share there. Nothing listening there is errdefs.ErrNotFound. ctx bounds
// the dial; the connection then lasts until either side closes it or the
// sandbox stops. Close on it sends a FIN (a half-close), and the guest
// closes its side in turn.
func (s *Sandbox) DialGuestPort(ctx context.Context, port uint16, ipv6 bool) (net.Conn, error) {
	if err := s.life.require(fmt.Sprintf("connect to port %d in the guest", port), PhaseReady); err != nil {
		return nil, err
	}
	return s.agent.DialPort(ctx, s.containers.processID(), port, ipv6)
}

// forwardPorts forwards the connections made to the loopback of the
// namespace at path on the host into the guest (portfwd), as CRI's
// port-forward makes them. Its failure leaves the sandbox without
// port-forward, not without its start: it is logged (portfwd says which
// family, and why).
func (s *Sandbox) forwardPorts(ctx context.Context, path string) {
	f, err := portfwd.Start(ctx, path, s.DialGuestPort, portfwd.Options{})
	if err != nil {
		log.G(ctx).WithError(err).Warn("no port forwarding into the guest")
		return
	}
	s.host.ports = f
	log.G(ctx).WithField("ipv4_port", f.Port(false)).WithField("ipv6_port", f.Port(true)).Debug("port forwarding into the guest")
}
