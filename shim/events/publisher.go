// Package events forwards the shim's task events to containerd over
// containerd's ttrpc API (containerd.services.events.ttrpc.v1.Events,
// Forward), at the address containerd gives a shim in TTRPC_ADDRESS. Every
// containerd from 1.6 on serves it.
//
// Publish never blocks on containerd: events go into one ordered queue
// that a single goroutine drains, retrying (and reconnecting) so that a
// restarting containerd loses nothing and no event overtakes another.
package events

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	eventsapi "github.com/containerd/containerd/api/services/ttrpc/events/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Retry policy of one event: attempts, spaced from minBackoff doubling to
// maxBackoff, then it is dropped with an error in the log (containerd's
// own publisher drops after 5 tries too).
const (
	maxAttempts    = 8
	minBackoff     = 50 * time.Millisecond
	maxBackoff     = 2 * time.Second
	forwardTimeout = 5 * time.Second
	dialTimeout    = 5 * time.Second
)

// Publisher forwards events to one containerd, in order. Delivery is at
// least once: a call cut by a containerd restart cannot tell whether the
// event arrived, so it is sent again.
type Publisher struct {
	address string
	ns      string
	// log is where the publisher reports what it drops.
	log *log.Entry

	// mu guards queue, closing and conn.
	mu sync.Mutex
	// queue holds the events not yet delivered, oldest first.
	queue []*types.Envelope
	// closing is set by Close: no more events are accepted.
	closing bool
	// wake has room for one signal that the queue grew or closing was set.
	wake chan struct{}
	// done is closed when the sender goroutine has ended.
	done chan struct{}
	// abort is closed when Close gives up waiting: the sender drops the
	// rest.
	abort chan struct{}
	// conn is the ttrpc client; nil while disconnected. Only the sender
	// goroutine uses it; Close closes it after the sender ended.
	conn *ttrpc.Client
}

// NewPublisher returns a Publisher forwarding to containerd's ttrpc
// address (a socket path, with or without unix://) events of namespace ns.
func NewPublisher(ctx context.Context, address, ns string) *Publisher {
	p := &Publisher{
		address: strings.TrimPrefix(address, "unix://"),
		ns:      ns,
		log:     log.G(ctx).WithField("component", "events"),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		abort:   make(chan struct{}),
	}
	go p.run()
	return p
}

// Publish queues event under topic. It never blocks on containerd.
func (p *Publisher) Publish(ctx context.Context, topic string, event proto.Message) {
	a, err := typeurl.MarshalAnyToProto(event)
	if err != nil {
		log.G(ctx).WithError(err).WithField("topic", topic).Error("encode event")
		return
	}
	env := &types.Envelope{Timestamp: timestamppb.Now(), Namespace: p.ns, Topic: topic, Event: a}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		log.G(ctx).WithField("topic", topic).Warn("event published after the publisher closed; dropped")
		return
	}
	p.queue = append(p.queue, env)
	p.signal()
}

// signal wakes the sender. Callers hold p.mu.
func (p *Publisher) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Close delivers what is queued, within ctx, and ends the publisher.
func (p *Publisher) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closing = true
	p.signal()
	p.mu.Unlock()
	var err error
	select {
	case <-p.done:
	case <-ctx.Done():
		p.mu.Lock()
		n := len(p.queue)
		p.mu.Unlock()
		err = fmt.Errorf("events: %d not delivered to containerd: %w", n, ctx.Err())
		close(p.abort)
	}
	// The sender may still be in a call; closing the client ends it.
	p.mu.Lock()
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.mu.Unlock()
	<-p.done
	return err
}

// run sends queued events in order until Close found the queue empty or
// gave up.
func (p *Publisher) run() {
	defer close(p.done)
	for {
		p.mu.Lock()
		if len(p.queue) == 0 {
			closing := p.closing
			p.mu.Unlock()
			if closing {
				return
			}
			select {
			case <-p.wake:
			case <-p.abort:
				return
			}
			continue
		}
		env := p.queue[0]
		p.mu.Unlock()
		if !p.deliver(env) {
			return
		}
		p.mu.Lock()
		p.queue = p.queue[1:]
		p.mu.Unlock()
	}
}

// deliver forwards one event, retrying with backoff; false if Close gave
// up meanwhile.
func (p *Publisher) deliver(env *types.Envelope) bool {
	backoff := minBackoff
	var err error
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		if err = p.forward(env); err == nil {
			return true
		}
		p.log.WithError(err).WithField("topic", env.Topic).WithField("attempt", attempt).Debug("forward event")
		select {
		case <-time.After(backoff):
		case <-p.abort:
			return false
		}
		backoff = min(2*backoff, maxBackoff)
	}
	p.log.WithError(err).WithField("topic", env.Topic).Error("event dropped: containerd did not take it")
	return true
}

// forward makes one attempt, connecting first if needed.
func (p *Publisher) forward(env *types.Envelope) error {
	c, err := p.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), forwardTimeout)
	defer cancel()
	_, err = eventsapi.NewTTRPCEventsClient(c).Forward(ctx, &eventsapi.ForwardRequest{Envelope: env})
	if _, answered := status.FromError(err); err != nil && !answered {
		// The connection failed, not the call: dial again next time.
		p.mu.Lock()
		if p.conn == c {
			p.conn = nil
		}
		p.mu.Unlock()
		_ = c.Close()
	}
	return err
}

// client returns the connection to containerd, dialing it if needed.
func (p *Publisher) client() (*ttrpc.Client, error) {
	p.mu.Lock()
	c := p.conn
	p.mu.Unlock()
	if c != nil {
		return c, nil
	}
	if p.address == "" {
		return nil, errors.New("containerd's ttrpc address is unknown (TTRPC_ADDRESS is not set)")
	}
	conn, err := net.DialTimeout("unix", p.address, dialTimeout)
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", p.address, err)
	}
	c = ttrpc.NewClient(conn)
	p.mu.Lock()
	p.conn = c
	p.mu.Unlock()
	return c, nil
}
