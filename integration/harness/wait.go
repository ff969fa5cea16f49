package harness

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// WaitStatus waits (60 s at most) for `ctr task ls` to show task id in
// status (RUNNING, PAUSED, STOPPED), failing t if it does not.
func (c *Containerd) WaitStatus(t testing.TB, id, status string) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(id) + `\s+\d+\s+` + status + `\s*$`)
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := c.Ctr("task", "ls")
		if err == nil && re.MatchString(out) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not %s after 60 s:\n%s %v", id, status, out, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// WaitNoShim waits (30 s at most) for this instance's shims to exit: the
// last Delete stops the VM, then Shutdown ends the shim.
func (c *Containerd) WaitNoShim(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(ShimPIDs(c.Address)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("shim still running: %v", ShimPIDs(c.Address))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Event is one line of `ctr events`.
type Event struct {
	// Topic is the event's topic, /tasks/exit for example.
	Topic string
	// Body is the rest of the line: the event's fields as JSON.
	Body string
}

// Events is a running `ctr events`.
type Events struct {
	cancel context.CancelFunc
	done   chan struct{}
	// mu guards out, which `ctr events` writes to.
	mu  sync.Mutex
	out bytes.Buffer
}

// Write is where `ctr events` writes its output.
func (e *Events) Write(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.out.Write(p)
}

// WatchEvents subscribes to the instance's events with `ctr events`
// until Stop, or the end of the test.
func (c *Containerd) WatchEvents(t testing.TB) *Events {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &Events{cancel: cancel, done: make(chan struct{})}
	cmd := c.CtrCommand(ctx, "events")
	cmd.Stdout = e
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(e.done) }()
	t.Cleanup(func() { cancel(); <-e.done })
	time.Sleep(300 * time.Millisecond) // subscribed
	return e
}

// Seen lists the events received so far whose topic starts with prefix
// ("/tasks/", for example).
func (e *Events) Seen(prefix string) []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var evs []Event
	for _, line := range strings.Split(e.out.String(), "\n") {
		// A time stamp (with spaces), the namespace, the topic, then the
		// event as JSON.
		f := strings.Fields(line)
		for i, w := range f {
			if strings.HasPrefix(w, "/") {
				if strings.HasPrefix(w, prefix) {
					evs = append(evs, Event{Topic: w, Body: strings.Join(f[i+1:], " ")})
				}
				break
			}
		}
	}
	return evs
}

// WaitFor waits (timeout at most) for an event with topic whose body
// contains substr, and reports whether it came.
func (e *Events) WaitFor(topic, substr string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		for _, ev := range e.Seen(topic) {
			if ev.Topic == topic && strings.Contains(ev.Body, substr) {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop ends `ctr events` (after a moment for the last event to arrive)
// and returns the topics of the task events received, in order.
func (e *Events) Stop() []string {
	time.Sleep(300 * time.Millisecond)
	e.cancel()
	<-e.done
	var topics []string
	for _, ev := range e.Seen("/tasks/") {
		topics = append(topics, ev.Topic)
	}
	return topics
}
