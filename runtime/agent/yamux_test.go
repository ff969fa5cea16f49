package agent

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/cocoonrt/cocoon/guest/api"
)

// yamuxServerForTest takes conn over as the guest does (the handshake,
// which waits for the host's) and starts a yamux server on it.
func yamuxServerForTest(conn net.Conn) (*yamux.Session, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	taken, err := api.GuestHandshake(ctx, conn)
	if err != nil {
		return nil, err
	}
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	return yamux.Server(taken, cfg)
}
