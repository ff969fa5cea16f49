package events

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
)

// fastRetry keeps the tests that wait for containerd short.
var fastRetry = backoff{min: time.Millisecond, max: 5 * time.Millisecond}

func exit(id string) *eventstypes.TaskExit { return &eventstypes.TaskExit{ContainerID: id} }
func oom(id string) *eventstypes.TaskOOM   { return &eventstypes.TaskOOM{ContainerID: id} }

// closeWithin closes p and fails t if the queue is not delivered.
func closeWithin(t *testing.T, p *Publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestOOMsCoalesce: while containerd does not take events, a flood of
// OOMs for one container waits as one event, in the place of the first,
// before the exit that followed it; exits are all kept.
func TestOOMsCoalesce(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "c.sock.ttrpc")
	p := newPublisher(context.Background(), sock, "ns", fastRetry)
	ctx := context.Background()
	p.Publish(ctx, "/tasks/exit", exit("a"))
	for range 10000 {
		p.Publish(ctx, "/tasks/oom", oom("c1"))
	}
	p.Publish(ctx, "/tasks/oom", oom("c2"))
	p.Publish(ctx, "/tasks/exit", exit("c1"))
	p.Publish(ctx, "/tasks/oom", oom("c1"))
	p.mu.Lock()
	queued := len(p.queue)
	p.mu.Unlock()
	if queued != 4 {
		t.Errorf("%d events queued, want 4", queued)
	}
	f := &fakeContainerd{}
	s := serveEvents(t, sock, f)
	defer s.Close()
	closeWithin(t, p)
	want := []string{"/tasks/exit a", "/tasks/oom c1", "/tasks/oom c2", "/tasks/exit c1"}
	if got := f.topics(); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestOOMAfterDeliveryIsSent: an OOM that comes once the last one was
// delivered is news, and is sent.
func TestOOMAfterDeliveryIsSent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "c.sock.ttrpc")
	f := &fakeContainerd{}
	s := serveEvents(t, sock, f)
	defer s.Close()
	p := newPublisher(context.Background(), sock, "ns", fastRetry)
	p.Publish(context.Background(), "/tasks/oom", oom("c1"))
	waitFor(t, func() bool { return len(f.topics()) == 1 })
	p.Publish(context.Background(), "/tasks/oom", oom("c1"))
	closeWithin(t, p)
	if got := f.topics(); len(got) != 2 {
		t.Errorf("got %v, want two OOMs", got)
	}
}

// TestCoalescableBound: OOMs of more containers than the bound, while
// containerd is away, do not grow the queue past it; the exit published
// after them is kept.
func TestCoalescableBound(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "c.sock.ttrpc")
	p := newPublisher(context.Background(), sock, "ns", fastRetry)
	ctx := context.Background()
	for i := range maxCoalescable + 100 {
		p.Publish(ctx, "/tasks/oom", oom(fmt.Sprint(i)))
	}
	p.Publish(ctx, "/tasks/exit", exit("last"))
	p.mu.Lock()
	queued, dropped := len(p.queue), p.dropped
	p.mu.Unlock()
	if queued != maxCoalescable+1 || dropped != 100 {
		t.Errorf("%d queued, %d dropped; want %d and 100", queued, dropped, maxCoalescable+1)
	}
	f := &fakeContainerd{}
	s := serveEvents(t, sock, f)
	defer s.Close()
	closeWithin(t, p)
	got := f.topics()
	if len(got) != maxCoalescable+1 || got[len(got)-1] != "/tasks/exit last" {
		t.Errorf("%d delivered, last %q; want %d ending with the exit", len(got), got[len(got)-1], maxCoalescable+1)
	}
}

// TestExitWaitsForContainerd: an exit is not dropped however long
// containerd is away (here longer than maxAttempts attempts).
func TestExitWaitsForContainerd(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "c.sock.ttrpc")
	p := newPublisher(context.Background(), sock, "ns", fastRetry)
	p.Publish(context.Background(), "/tasks/exit", exit("a"))
	time.Sleep(time.Duration(3*maxAttempts) * fastRetry.max)
	f := &fakeContainerd{}
	s := serveEvents(t, sock, f)
	defer s.Close()
	closeWithin(t, p)
	if got := f.topics(); !reflect.DeepEqual(got, []string{"/tasks/exit a"}) {
		t.Errorf("got %v, want the exit", got)
	}
}

// TestRefusedEventDropped: an event containerd keeps refusing is dropped
// after maxAttempts, so that it does not hold back the ones after it.
func TestRefusedEventDropped(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "c.sock.ttrpc")
	f := &fakeContainerd{failNext: maxAttempts}
	s := serveEvents(t, sock, f)
	defer s.Close()
	p := newPublisher(context.Background(), sock, "ns", fastRetry)
	p.Publish(context.Background(), "/tasks/exit", exit("refused"))
	p.Publish(context.Background(), "/tasks/exit", exit("next"))
	closeWithin(t, p)
	if got := f.topics(); !reflect.DeepEqual(got, []string{"/tasks/exit next"}) {
		t.Errorf("got %v, want only the event after the refused one", got)
	}
}

// TestCloseGivesUp: Close returns at its deadline with containerd away,
// saying how many events were not delivered.
func TestCloseGivesUp(t *testing.T) {
	p := newPublisher(context.Background(), filepath.Join(t.TempDir(), "none"), "ns", fastRetry)
	p.Publish(context.Background(), "/tasks/exit", exit("a"))
	p.Publish(context.Background(), "/tasks/oom", oom("a"))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := p.Close(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "2 not delivered") {
		t.Errorf("Close = %v, want a deadline error counting 2 events", err)
	}
}
