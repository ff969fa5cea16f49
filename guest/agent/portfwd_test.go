//go:build linux

package agent

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestPortConnsBound(t *testing.T) {
	var p portConns
	for i := range maxPortConns {
		if !p.take() {
			t.Fatalf("take %d refused", i)
		}
	}
	if p.take() {
		t.Fatal("took one over the bound")
	}
	p.release()
	if !p.take() {
		t.Fatal("a released slot was not taken again")
	}
}

func TestDialErrorKinds(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = net.Dial("tcp4", addr)
	if err == nil {
		t.Skip("something listens on the closed port again")
	}
	if got := dialError(addr, err); !errdefs.IsNotFound(got) {
		t.Fatalf("refused: %v, want not found", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	var d net.Dialer
	_, err = d.DialContext(ctx, "tcp4", "127.0.0.1:1")
	if got := dialError("127.0.0.1:1", err); !errdefs.IsDeadlineExceeded(got) {
		t.Fatalf("timed out: %v, want deadline exceeded", got)
	}
}
