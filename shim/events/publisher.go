// Package events forwards the shim's task events to containerd over
// containerd's ttrpc API (containerd.services.events.ttrpc.v1.Events,
// Forward), at the address containerd gives a shim in TTRPC_ADDRESS. Every
// containerd from 1.6 on serves it.
//
// Publish never blocks on containerd: events go into one ordered queue
// that a single goroutine drains, retrying (and reconnecting) so that a
// restarting containerd loses nothing and no event overtakes another.
//
// The queue is bounded where the guest could fill it. An event the guest
// causes on its own (an OOM kill) is coalescable: one that reports what an
// event still waiting in the queue reports (the same container's OOM) is
// folded into it, which keeps its place, so that the OOM still precedes
// the exit it caused; and no more than maxCoalescable of them wait at once
// (beyond that the new one is dropped, with a warning). Every other event
// (create, start, exec, exit, delete, pause, resume) is caused by a
// containerd call or by the end of a process containerd started, so
// containerd bounds their number; they are never dropped by the queue,
// and while containerd is unreachable they wait for it. Publish does not
// block either way: its callers hold the Task service's lock.
package events

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/ttrpc/events/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Retry policy of one event: attempts are spaced from minBackoff doubling
// to maxBackoff. While containerd cannot be reached the event is retried
// until it can (or Close gives up), with a warning after maxAttempts; an
// event containerd answers with an error maxAttempts times is dropped with
// an error in the log (containerd's own publisher drops after 5 tries),
// since retrying it would hold back every event after it.
const (
	maxAttempts    = 8
	minBackoff     = 50 * time.Millisecond
	maxBackoff     = 2 * time.Second
	forwardTimeout = 5 * time.Second
	dialTimeout    = 5 * time.Second
)

// backoff is the spacing of retries: from min, doubling, up to max.
type backoff struct{ min, max time.Duration }

// maxCoalescable bounds the coalescable events waiting at once. Coalescing
// leaves at most one per container, so only a sandbox of more containers
// than this, all OOM-killed while containerd does not take events, loses
// one.
const maxCoalescable = 1024

// Publisher forwards events to one containerd, in order. Delivery is at
// least once: a call cut by a containerd restart cannot tell whether the
// event arrived, so it is sent again.
type Publisher struct {
	address string
	ns      string
	// log is where the publisher reports what it drops.
	log *log.Entry
	// retry spaces the attempts to deliver an event.
	retry backoff

	// mu guards queue, waiting, coalescable, dropped, closing and conn.
	mu sync.Mutex
	// queue holds the events not yet delivered, oldest first; the sender
	// delivers queue[0].
	queue []entry
	// waiting holds the keys of the coalescable events queued and not
	// being delivered: a new event with one of these keys is redundant.
	waiting map[string]bool
	// coalescable counts the coalescable events in queue.
	coalescable int
	// dropped counts the coalescable events dropped for want of room.
	dropped int
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

// entry is a queued event.
type entry struct {
	env *types.Envelope
	// key says what a coalescable event reports (see coalesceKey); empty
	// for an event that is always delivered.
	key string
}

// coalesceKey returns what a coalescable event reports, "" for an event
// that must be delivered. Only an OOM is coalescable: the guest reports
// it on its own, as often as its kernel kills, and a TaskOOM says no more
// than which container it was.
func coalesceKey(event proto.Message) string {
	if oom, ok := event.(*eventstypes.TaskOOM); ok {
		return "oom " + oom.ContainerID
	}
	return ""
}

// NewPublisher returns a Publisher forwarding to containerd's ttrpc
// address (a socket path, with or without unix://) events of namespace ns.
func NewPublisher(ctx context.Context, address, ns string) *Publisher {
	return newPublisher(ctx, address, ns, backoff{minBackoff, maxBackoff})
}

func newPublisher(ctx context.Context, address, ns string, retry backoff) *Publisher {
	p := &Publisher{
		address: strings.TrimPrefix(address, "unix://"),
		ns:      ns,
		log:     log.G(ctx).WithField("component", "events"),
		retry:   retry,
		waiting: make(map[string]bool),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		abort:   make(chan struct{}),
	}
	go p.run()
	return p
}

// Publish queues event under topic, unless it is coalescable and
// redundant or there is no room for it (see the package's doc). It never
// blocks.
func (p *Publisher) Publish(ctx context.Context, topic string, event proto.Message) {
	key := coalesceKey(event)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		log.G(ctx).WithField("topic", topic).Warn("event published after the publisher closed; dropped")
		return
	}
	if key != "" {
		if p.waiting[key] {
			return
		}
		if p.coalescable >= maxCoalescable {
			p.dropped++
			if p.dropped == 1 || p.dropped%1000 == 0 {
				log.G(ctx).WithField("topic", topic).WithField("dropped", p.dropped).Warn("event queue full: dropping events the guest reports")
			}
			return
		}
	}
	a, err := typeurl.MarshalAnyToProto(event)
	if err != nil {
		log.G(ctx).WithError(err).WithField("topic", topic).Error("encode event")
		return
	}
	env := &types.Envelope{Timestamp: timestamppb.Now(), Namespace: p.ns, Topic: topic, Event: a}
	if key != "" {
		p.waiting[key] = true
		p.coalescable++
	}
	p.queue = append(p.queue, entry{env: env, key: key})
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
		e := p.queue[0]
		if e.key != "" {
			// From now on an event like it reports something newer.
			delete(p.waiting, e.key)
		}
		p.mu.Unlock()
		if !p.deliver(e.env) {
			return
		}
		p.mu.Lock()
		p.queue[0] = entry{}
		p.queue = p.queue[1:]
		if e.key != "" {
			p.coalescable--
		}
		p.mu.Unlock()
	}
}

// deliver forwards one event, retrying with backoff (see maxAttempts);
// false if Close gave up meanwhile.
func (p *Publisher) deliver(env *types.Envelope) bool {
	wait := p.retry.min
	refused := 0
	for attempt := 1; ; attempt++ {
		err := p.forward(env)
		if err == nil {
			return true
		}
		lg := p.log.WithError(err).WithField("topic", env.Topic).WithField("attempt", attempt)
		if _, answered := status.FromError(err); answered {
			if refused++; refused >= maxAttempts {
				lg.Error("event dropped: containerd refused it")
				return true
			}
		}
		if attempt == maxAttempts {
			lg.Warn("containerd does not take events; retrying until it does")
		} else {
			lg.Debug("forward event")
		}
		select {
		case <-time.After(wait):
		case <-p.abort:
			return false
		}
		wait = min(2*wait, p.retry.max)
	}
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
