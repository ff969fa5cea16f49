package agent

import (
	"context"
	"fmt"
	"net"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/api"
)

// DialPort connects to a TCP port of the guest's loopback (127.0.0.1, or
// ::1 with ipv6) and returns the connection: a port stream named
// streamID (an id unique among the session's process and stream ids, as
// ProcessSpec.ID) that the agent splices to it. Close sends a FIN, as
// CloseWrite does on TCP, and the guest closes its connection's half in
// turn; the stream lasts until both sides closed or the session ends.
// Nothing listening there is errdefs.ErrNotFound. The call waits for the
// guest's listener as much as for the agent, so SetCallTimeout's bound,
// whose miss ends the sandbox, does not apply: ctx bounds it, and the
// caller gives ctx a deadline. What comes on the connection is the
// guest's: the caller bounds it.
func (c *Client) DialPort(ctx context.Context, streamID string, port uint16, ipv6 bool) (net.Conn, error) {
	addr := "127.0.0.1"
	if ipv6 {
		addr = "[::1]"
	}
	op := fmt.Sprintf("connect to %s:%d in the guest", addr, port)
	if err := api.ValidID(streamID); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", op, errdefs.ErrInvalidArgument, err)
	}
	if port == 0 {
		return nil, fmt.Errorf("%s: port 0: %w", op, errdefs.ErrInvalidArgument)
	}
	// Opened first: the agent claims it when the call arrives, as stdio
	// streams are, and the host sends nothing on it until the answer.
	s, err := openStream(c.sess, api.StreamHeader{Kind: api.StreamPort, ID: streamID})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if _, err := c.agent.DialPort(ctx, &api.DialPortRequest{Port: uint32(port), Ipv6: ipv6, StreamId: streamID}); err != nil {
		_ = s.Close()
		return nil, c.mapErr(op, err)
	}
	return s, nil
}
