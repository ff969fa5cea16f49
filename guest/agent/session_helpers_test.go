//go:build linux

package agent_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/api"
)

// hostSession is the host's end of an agent session, opening streams.
type hostSession struct {
	sess *yamux.Session
}

func newHostSession(t *testing.T, s *agent.Service) *hostSession {
	t.Helper()
	host, guest := agenttest.SocketPair(t)
	conns := []net.Conn{host, guest}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = s.Serve(ctx, conns[1])
	}()
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.LogOutput = nil
	cfg.Logger = nil
	cfg.LogOutput = os.Stderr
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	taken, err := api.HostHandshake(hctx, conns[0])
	hcancel()
	if err != nil {
		t.Fatal(err)
	}
	sess, err := yamux.Client(taken, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sess.Close()
		cancel()
		<-served
	})
	return &hostSession{sess: sess}
}

func (h *hostSession) open(t *testing.T, kind api.StreamKind, id string) net.Conn {
	t.Helper()
	st, err := h.sess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := api.WriteStreamHeader(st, api.StreamHeader{Kind: kind, ID: id}); err != nil {
		t.Fatal(err)
	}
	return st
}

func runtimeForce(cfg agent.Config, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, cfg.Runtime, "--root", cfg.RuntimeRoot, "delete", "--force", id).Run()
}
