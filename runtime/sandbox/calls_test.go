package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestCallGate(t *testing.T) {
	var g callGate
	leave, err := g.enter("call 1")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan int)
	go func() { closed <- g.close(context.Background(), time.Minute) }()
	select {
	case n := <-closed:
		t.Fatalf("close returned (%d in flight) before the call left", n)
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := g.enter("call 2"); !errdefs.IsUnavailable(err) {
		t.Errorf("enter while closing: %v, want unavailable", err)
	}
	leave()
	select {
	case n := <-closed:
		if n != 0 {
			t.Errorf("close reported %d calls in flight, want 0", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("close still waits after the last call left")
	}

	var h callGate
	if _, err := h.enter("stuck"); err != nil {
		t.Fatal(err)
	}
	if n := h.close(context.Background(), 20*time.Millisecond); n != 1 {
		t.Errorf("close gave up with %d in flight, want 1", n)
	}
}
