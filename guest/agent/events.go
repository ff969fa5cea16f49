//go:build linux

package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/api"
)

// eventQueue holds the events that wait for the host's NextEvent call.
// It is bounded: when full, the oldest event is dropped (and logged), so
// a host that stopped asking cannot make the guest hoard memory.
type eventQueue struct {
	// max bounds events.
	max int

	// mu guards events and wake.
	mu     sync.Mutex
	events []*api.Event
	// wake is closed, and replaced, when an event is queued.
	wake chan struct{}
}

func newEventQueue(max int) *eventQueue {
	return &eventQueue{max: max, wake: make(chan struct{})}
}

// push queues e.
func (q *eventQueue) push(ctx context.Context, e *api.Event) {
	q.mu.Lock()
	if len(q.events) >= q.max {
		dropped := q.events[0]
		q.events = q.events[1:]
		log.G(ctx).WithField("container", dropped.ContainerId).WithField("kind", dropped.Kind.String()).
			Warn("event queue full (is the host asking for events?); dropping the oldest event")
	}
	q.events = append(q.events, e)
	close(q.wake)
	q.wake = make(chan struct{})
	q.mu.Unlock()
}

// next returns the oldest event, waiting for one until ctx ends.
func (q *eventQueue) next(ctx context.Context) (*api.Event, error) {
	for {
		q.mu.Lock()
		if len(q.events) > 0 {
			e := q.events[0]
			q.events[0] = nil
			q.events = q.events[1:]
			q.mu.Unlock()
			return e, nil
		}
		wake := q.wake
		q.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for event: %w", ctx.Err())
		}
	}
}

// NextEvent returns the next event for the host, waiting until there is
// one or the call is cancelled.
func (s *Service) NextEvent(ctx context.Context, _ *api.NextEventRequest) (*api.Event, error) {
	return s.containers.events.next(ctx)
}

// oomWatcher watches the memory.events files of containers' cgroups with
// inotify (cgroup v2 signals a change of the file as a modification) and
// reports an increase of a container's oom_kill counter.
type oomWatcher struct {
	// file is the inotify instance.
	file *os.File
	// report is called, from the watcher's goroutine, for each increase
	// of a container's OOM kill count, with the new count.
	report func(containerID string, kills uint64)

	// mu guards watches.
	mu      sync.Mutex
	watches map[int32]*oomWatch
}

// oomWatch is one container's memory.events.
type oomWatch struct {
	// containerID is reported with each OOM kill.
	containerID string
	// path is the memory.events file.
	path string
	// kills is the last oom_kill count seen; only the watcher's
	// goroutine touches it after add.
	kills uint64
}

func newOOMWatcher(ctx context.Context, report func(containerID string, kills uint64)) (*oomWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &oomWatcher{
		// Non-blocking, so the runtime poller serves reads.
		file:    os.NewFile(uintptr(fd), "inotify"),
		report:  report,
		watches: make(map[int32]*oomWatch),
	}
	go w.loop(ctx)
	return w, nil
}

// add watches the memory.events file at path for containerID and
// returns the watch descriptor.
func (w *oomWatcher) add(containerID, path string) (int32, error) {
	kills, err := oomKills(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	sc, err := w.file.SyscallConn()
	if err != nil {
		return 0, err
	}
	var wd int
	var werr error
	if err := sc.Control(func(fd uintptr) {
		wd, werr = unix.InotifyAddWatch(int(fd), path, unix.IN_MODIFY)
	}); err != nil {
		return 0, err
	}
	if werr != nil {
		return 0, fmt.Errorf("watch %s: %w", path, werr)
	}
	w.mu.Lock()
	w.watches[int32(wd)] = &oomWatch{containerID: containerID, path: path, kills: kills}
	w.mu.Unlock()
	return int32(wd), nil
}

// remove stops watching wd. The kernel may have dropped the watch
// already (the cgroup was removed); that is fine.
func (w *oomWatcher) remove(wd int32) {
	w.mu.Lock()
	_, ok := w.watches[wd]
	delete(w.watches, wd)
	w.mu.Unlock()
	if !ok {
		return
	}
	if sc, err := w.file.SyscallConn(); err == nil {
		_ = sc.Control(func(fd uintptr) {
			_, _ = unix.InotifyRmWatch(int(fd), uint32(wd))
		})
	}
}

func (w *oomWatcher) loop(ctx context.Context) {
	// Watches on files carry no names; room for names anyway, so that
	// an event is never split.
	buf := make([]byte, 16*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				log.G(ctx).WithError(err).Error("oom watcher stopped")
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			off += unix.SizeofInotifyEvent + nameLen
			switch {
			case mask&unix.IN_IGNORED != 0:
				w.mu.Lock()
				delete(w.watches, wd)
				w.mu.Unlock()
			case mask&unix.IN_MODIFY != 0:
				w.check(ctx, wd)
			case mask&unix.IN_Q_OVERFLOW != 0:
				w.checkAll(ctx)
			}
		}
	}
}

func (w *oomWatcher) check(ctx context.Context, wd int32) {
	w.mu.Lock()
	watch := w.watches[wd]
	w.mu.Unlock()
	if watch != nil {
		w.checkOne(ctx, watch)
	}
}

// checkAll looks at every watched file, after the kernel's event queue
// overflowed and modifications may have been missed.
func (w *oomWatcher) checkAll(ctx context.Context) {
	w.mu.Lock()
	all := make([]*oomWatch, 0, len(w.watches))
	for _, watch := range w.watches {
		all = append(all, watch)
	}
	w.mu.Unlock()
	for _, watch := range all {
		w.checkOne(ctx, watch)
	}
}

func (w *oomWatcher) checkOne(ctx context.Context, watch *oomWatch) {
	kills, err := oomKills(watch.path)
	if err != nil {
		// The cgroup is going away with its container.
		return
	}
	if kills > watch.kills {
		log.G(ctx).WithField("container", watch.containerID).WithField("oom_kills", kills).Info("container process killed by the OOM killer")
		watch.kills = kills
		w.report(watch.containerID, kills)
	}
}
