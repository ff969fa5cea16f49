package events

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/ttrpc/events/v1"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/emptypb"
)

// fakeContainerd is containerd's ttrpc events service.
type fakeContainerd struct {
	mu sync.Mutex // guards got and failNext
	// got are the forwarded envelopes' topics and container ids.
	got []string
	// failNext fails that many calls first.
	failNext int
}

func (f *fakeContainerd) Forward(ctx context.Context, r *eventsapi.ForwardRequest) (*emptypb.Empty, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failNext > 0 {
		f.failNext--
		return nil, fmt.Errorf("busy")
	}
	ev, err := typeurl.UnmarshalAny(r.Envelope.Event)
	if err != nil {
		return nil, err
	}
	if r.Envelope.Namespace != "ns" {
		return nil, fmt.Errorf("namespace %q", r.Envelope.Namespace)
	}
	var id string
	switch ev := ev.(type) {
	case *eventstypes.TaskExit:
		id = ev.ContainerID
	case *eventstypes.TaskOOM:
		id = ev.ContainerID
	default:
		return nil, fmt.Errorf("unexpected event %T", ev)
	}
	f.got = append(f.got, r.Envelope.Topic+" "+id)
	return &emptypb.Empty{}, nil
}

func (f *fakeContainerd) topics() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

func serveEvents(t *testing.T, sock string, f *fakeContainerd) *ttrpc.Server {
	t.Helper()
	s, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	eventsapi.RegisterTTRPCEventsService(s, f)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(context.Background(), l)
	return s
}

// TestOrderAndRetry: events arrive in order, after containerd was down at
// first and then refused a call.
func TestOrderAndRetry(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "c.sock.ttrpc")
	p := NewPublisher(context.Background(), "unix://"+sock, "ns")
	for i := range 20 {
		p.Publish(context.Background(), "/tasks/exit", &eventstypes.TaskExit{ContainerID: fmt.Sprint(i)})
	}
	time.Sleep(100 * time.Millisecond) // nobody listens yet
	f := &fakeContainerd{failNext: 1}
	s := serveEvents(t, sock, f)
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got := f.topics()
	if len(got) != 20 {
		t.Fatalf("%d events delivered, want 20: %v", len(got), got)
	}
	for i, g := range got {
		if want := fmt.Sprintf("/tasks/exit %d", i); g != want {
			t.Fatalf("event %d = %q, want %q", i, g, want)
		}
	}
}

// TestReconnect: a containerd restart between events loses nothing. An
// event whose call was cut by the restart may arrive twice: delivery is at
// least once, as an unanswered call cannot tell whether it was received.
func TestReconnect(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "c.sock.ttrpc")
	f := &fakeContainerd{}
	s := serveEvents(t, sock, f)
	p := NewPublisher(context.Background(), sock, "ns")
	p.Publish(context.Background(), "/tasks/exit", &eventstypes.TaskExit{ContainerID: "a"})
	waitFor(t, func() bool { return len(f.topics()) == 1 })
	s.Close()
	p.Publish(context.Background(), "/tasks/exit", &eventstypes.TaskExit{ContainerID: "b"})
	time.Sleep(100 * time.Millisecond)
	s = serveEvents(t, sock, f)
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got := f.topics()
	var distinct []string
	for i, g := range got {
		if i == 0 || g != got[i-1] {
			distinct = append(distinct, g)
		}
	}
	if len(distinct) != 2 || distinct[0] != "/tasks/exit a" || distinct[1] != "/tasks/exit b" {
		t.Errorf("got %v, want a then b (b possibly repeated)", got)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
