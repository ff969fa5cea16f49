//go:build linux

package agent

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/api"
)

// pipeEnd returns one end of a net.Pipe and a func reporting whether the
// other side saw it closed.
func pipeEnd(t *testing.T) (net.Conn, func() bool) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, func() bool {
		_ = b.SetReadDeadline(time.Now().Add(time.Second))
		_, err := b.Read(make([]byte, 1))
		return err == io.EOF
	}
}

func TestStreamsParkedThenClaimed(t *testing.T) {
	r := newStreamRegistry(time.Second, 10)
	out, _ := pipeEnd(t)
	in, _ := pipeEnd(t)
	if err := r.deliver("p", api.StreamStdout, out); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = r.deliver("p", api.StreamStdin, in)
	}()
	got, err := r.claim(context.Background(), "p", []api.StreamKind{api.StreamStdin, api.StreamStdout}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got[api.StreamStdout] != out || got[api.StreamStdin] != in {
		t.Fatalf("wrong streams: %v", got)
	}
}

func TestStreamsClaimTimeoutReleases(t *testing.T) {
	r := newStreamRegistry(time.Second, 10)
	out, closed := pipeEnd(t)
	if err := r.deliver("p", api.StreamStdout, out); err != nil {
		t.Fatal(err)
	}
	_, err := r.claim(context.Background(), "p", []api.StreamKind{api.StreamStdout, api.StreamStderr}, 50*time.Millisecond)
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("want failed precondition, got %v", err)
	}
	if !closed() {
		t.Fatal("stream of a failed claim left open")
	}
}

func TestStreamsUnclaimedExpire(t *testing.T) {
	r := newStreamRegistry(30*time.Millisecond, 10)
	out, closed := pipeEnd(t)
	if err := r.deliver("p", api.StreamStdout, out); err != nil {
		t.Fatal(err)
	}
	if !closed() {
		t.Fatal("unclaimed stream not closed")
	}
	r.mu.Lock()
	n := len(r.parked)
	r.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d streams still parked", n)
	}
}

func TestStreamsDuplicateAndBounds(t *testing.T) {
	r := newStreamRegistry(time.Second, 2)
	a, _ := pipeEnd(t)
	b, bClosed := pipeEnd(t)
	c, _ := pipeEnd(t)
	d, dClosed := pipeEnd(t)
	if err := r.deliver("p", api.StreamStdout, a); err != nil {
		t.Fatal(err)
	}
	if err := r.deliver("p", api.StreamStdout, b); !errdefs.IsAlreadyExists(err) || !bClosed() {
		t.Fatalf("duplicate: %v", err)
	}
	if err := r.deliver("q", api.StreamStdout, c); err != nil {
		t.Fatal(err)
	}
	if err := r.deliver("r", api.StreamStdout, d); !errdefs.IsResourceExhausted(err) || !dClosed() {
		t.Fatalf("over bound: %v", err)
	}
	r.close()
}

func TestStreamsUnwantedKindDropped(t *testing.T) {
	r := newStreamRegistry(time.Second, 10)
	errStream, closed := pipeEnd(t)
	if err := r.deliver("p", api.StreamStderr, errStream); err != nil {
		t.Fatal(err)
	}
	got, err := r.claim(context.Background(), "p", nil, time.Second)
	if err != nil || len(got) != 0 {
		t.Fatalf("got %v %v", got, err)
	}
	if !closed() {
		t.Fatal("unwanted stream not closed")
	}
}

func TestStreamsAbandonedReplaced(t *testing.T) {
	r := newStreamRegistry(time.Second, 10)
	a, b := net.Pipe()
	defer a.Close()
	if err := r.deliver("p", api.StreamStdout, a); err != nil {
		t.Fatal(err)
	}
	// The host gave up on the first stream (a failed start).
	b.Close()
	fresh, _ := pipeEnd(t)
	if err := r.deliver("p", api.StreamStdout, fresh); err != nil {
		t.Fatalf("fresh stream refused: %v", err)
	}
	got, err := r.claim(context.Background(), "p", []api.StreamKind{api.StreamStdout}, time.Second)
	if err != nil || got[api.StreamStdout] != fresh {
		t.Fatalf("got %v %v", got, err)
	}
}
