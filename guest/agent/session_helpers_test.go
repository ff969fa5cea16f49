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
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/api"
)

// hostSession is the host's end of an agent session, opening streams.
type hostSession struct {
	sess *yamux.Session
}

func newHostSession(t *testing.T, s *agent.Service) *hostSession {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
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
	sess, err := yamux.Client(conns[0], cfg)
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

func runcForce(cfg agent.Config, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, cfg.Runc, "--root", cfg.RuncRoot, "delete", "--force", id).Run()
}
