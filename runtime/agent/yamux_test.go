package agent

import (
	"io"
	"net"

	"github.com/hashicorp/yamux"
)

func yamuxServerForTest(conn net.Conn) (*yamux.Session, error) {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	return yamux.Server(conn, cfg)
}
