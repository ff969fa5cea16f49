package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/agent"
)

// eventBuffer is how many events Events holds for a slow reader before
// the sandbox stops asking the guest for more (the guest then queues
// them, bounded).
const eventBuffer = 64

// eventRetry paces NextEvent after an unexpected error.
const eventRetry = time.Second

// EventKind says what happened to a container.
type EventKind int

const (
	// EventOOM: the guest kernel OOM-killed a process of the container.
	EventOOM EventKind = iota + 1
)

func (k EventKind) String() string {
	if k == EventOOM {
		return "oom"
	}
	return fmt.Sprintf("event(%d)", int(k))
}

// Event is something that happened to a container in the guest.
type Event struct {
	Kind        EventKind
	ContainerID string
	// OOMKills is the container's count of OOM kills so far (EventOOM).
	OOMKills uint64
}

// Events returns the containers' events (OOM kills). The first call
// starts asking the guest for them; the channel is closed when the
// sandbox stops. Every call returns the same channel.
func (s *Sandbox) Events() <-chan Event {
	c := &s.containers
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.events != nil {
		return c.events
	}
	c.events = make(chan Event, eventBuffer)
	if c.closed || s.agent == nil {
		close(c.events)
		return c.events
	}
	ctx, cancel := context.WithCancel(context.Background())
	ctx = log.WithLogger(ctx, log.L.WithField("sandbox", s.ID))
	c.stopLoop, c.loopDone = cancel, make(chan struct{})
	go s.eventLoop(ctx, c.events, c.loopDone)
	return c.events
}

// eventLoop keeps one NextEvent call in flight and forwards what it gets,
// until ctx ends or the agent session does.
func (s *Sandbox) eventLoop(ctx context.Context, events chan<- Event, done chan<- struct{}) {
	defer close(done)
	defer close(events)
	for {
		e, err := s.agent.NextEvent(ctx)
		if err != nil {
			if ctx.Err() != nil || errdefs.IsUnavailable(err) {
				return
			}
			if errdefs.IsNotImplemented(err) {
				log.G(ctx).WithError(err).Warn("guest agent sends no events; OOM kills are not reported")
				return
			}
			log.G(ctx).WithError(err).Warn("guest events")
			t := time.NewTimer(eventRetry)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		var ev Event
		switch e.Kind {
		case agent.EventOOM:
			ev = Event{Kind: EventOOM, ContainerID: s.containers.hostID(e.ContainerID), OOMKills: e.OOMKills}
		default:
			log.G(ctx).WithField("container", e.ContainerID).Debug("unknown guest event dropped")
			continue
		}
		select {
		case events <- ev:
		case <-ctx.Done():
			return
		}
	}
}

// hostID is the id of the container the guest knows as guest: they
// differ for a container restored under a new id.
func (c *containers) hostID(guest string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, ct := range c.byID {
		if ct.guest == guest {
			return id
		}
	}
	return guest
}
