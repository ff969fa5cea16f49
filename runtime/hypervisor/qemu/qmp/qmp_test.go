package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

const greeting = `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7+deb12u18+b3"}, "capabilities": ["oob"]}}` + "\r\n"

// request is what the fake server decodes from the client.
type request struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        *uint64         `json:"id"`
}

// fakeQEMU serves the server side of a pipe. handle is called for every
// request after qmp_capabilities and writes whatever it wants through send.
type fakeQEMU struct {
	t    *testing.T
	conn net.Conn
	// mu serializes writes to conn.
	mu sync.Mutex
}

func (f *fakeQEMU) send(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conn.Write([]byte(s + "\r\n"))
}

func (f *fakeQEMU) reply(id *uint64, ret string) {
	f.send(fmt.Sprintf(`{"return": %s, "id": %d}`, ret, *id))
}

// startFake returns a connected client and the fake behind it.
func startFake(t *testing.T, handle func(f *fakeQEMU, r request)) (*Client, *fakeQEMU) {
	t.Helper()
	cli, srv := net.Pipe()
	f := &fakeQEMU{t: t, conn: srv}
	go func() {
		f.send(strings.TrimSpace(greeting))
		sc := bufio.NewScanner(srv)
		for sc.Scan() {
			var r request
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Errorf("fake qemu: bad request %q: %v", sc.Text(), err)
				return
			}
			if r.ID == nil {
				t.Errorf("fake qemu: request without id: %q", sc.Text())
				return
			}
			if r.Execute == "qmp_capabilities" {
				f.reply(r.ID, "{}")
				continue
			}
			handle(f, r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := New(ctx, cli, Options{MaxLineBytes: 4096})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close(); srv.Close() })
	return c, f
}

func TestHandshakeAndExecute(t *testing.T) {
	c, _ := startFake(t, func(f *fakeQEMU, r request) {
		switch r.Execute {
		case "query-status":
			f.reply(r.ID, `{"status": "running", "singlestep": false, "running": true}`)
		case "echo":
			f.reply(r.ID, string(r.Arguments))
		}
	})
	if got := c.Greeting().Version.String(); got != "7.2.22" {
		t.Errorf("greeting version = %q", got)
	}
	ctx := context.Background()
	st, err := c.QueryStatus(ctx)
	if err != nil || !st.Running || st.Status != "running" {
		t.Fatalf("QueryStatus = %+v, %v", st, err)
	}
	var out map[string]int
	if err := c.Execute(ctx, "echo", map[string]int{"a": 1}, &out); err != nil || out["a"] != 1 {
		t.Fatalf("echo = %v, %v", out, err)
	}
}

func TestErrorReplyIsTyped(t *testing.T) {
	c, _ := startFake(t, func(f *fakeQEMU, r request) {
		f.send(fmt.Sprintf(`{"error": {"class": "CommandNotFound", "desc": "The command %s has not been found"}, "id": %d}`, r.Execute, *r.ID))
	})
	err := c.Execute(context.Background(), "nope", nil, nil)
	var qe *Error
	if !errors.As(err, &qe) || qe.Class != "CommandNotFound" || !strings.Contains(qe.Desc, "nope") {
		t.Fatalf("err = %v, want *Error CommandNotFound", err)
	}
	// The connection stays usable after an error reply.
	if err := c.Execute(context.Background(), "nope2", nil, nil); !errors.As(err, &qe) {
		t.Fatalf("second call: %v", err)
	}
}

func TestConcurrentCallsOutOfOrderReplies(t *testing.T) {
	const n = 20
	var mu sync.Mutex
	var held []request
	c, _ := startFake(t, func(f *fakeQEMU, r request) {
		mu.Lock()
		defer mu.Unlock()
		held = append(held, r)
		if len(held) == n {
			// Answer in reverse order: ids, not order, must match.
			for i := len(held) - 1; i >= 0; i-- {
				f.reply(held[i].ID, string(held[i].Arguments))
			}
		}
	})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out struct{ N int }
			if err := c.Execute(context.Background(), "echo", struct{ N int }{i}, &out); err != nil {
				t.Errorf("call %d: %v", i, err)
			} else if out.N != i {
				t.Errorf("call %d got reply for %d", i, out.N)
			}
		}()
	}
	wg.Wait()
}

func TestEventsAndDropOldest(t *testing.T) {
	c, f := startFake(t, func(f *fakeQEMU, r request) { f.reply(r.ID, "{}") })
	ev, cancel := c.Subscribe(2)
	defer cancel()
	all, cancelAll := c.Subscribe(0)
	defer cancelAll()
	for i := range 5 {
		f.send(fmt.Sprintf(`{"timestamp": {"seconds": 1700000000, "microseconds": %d}, "event": "STOP", "data": {"n": %d}}`, i, i))
	}
	// A round trip after the events proves the reader has handled them.
	if err := c.Execute(context.Background(), "sync", nil, nil); err != nil {
		t.Fatal(err)
	}
	var got []int
	for len(ev) > 0 {
		e := <-ev
		var d struct{ N int }
		json.Unmarshal(e.Data, &d)
		got = append(got, d.N)
		if e.Name != EventStop || e.Time.Unix() != 1700000000 {
			t.Errorf("event = %+v", e)
		}
	}
	if fmt.Sprint(got) != "[3 4]" {
		t.Errorf("small subscription kept %v, want the newest [3 4]", got)
	}
	if len(all) != 5 {
		t.Errorf("large subscription has %d events, want 5", len(all))
	}
}

func TestContextCancel(t *testing.T) {
	replies := make(chan request, 4)
	c, f := startFake(t, func(f *fakeQEMU, r request) {
		if r.Execute == "slow" {
			replies <- r // answered later
			return
		}
		f.reply(r.ID, `"fast"`)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Execute(ctx, "slow", nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("cancel took %v", d)
	}
	// The late reply is dropped and does not confuse the next call.
	f.reply((<-replies).ID, `"late"`)
	var s string
	if err := c.Execute(context.Background(), "fast", nil, &s); err != nil || s != "fast" {
		t.Fatalf("next call = %q, %v", s, err)
	}
}

func TestOverlongLineEndsConnection(t *testing.T) {
	c, f := startFake(t, func(f *fakeQEMU, r request) {
		f.send(fmt.Sprintf(`{"return": "%s", "id": %d}`, strings.Repeat("x", 8192), *r.ID))
	})
	ev, _ := c.Subscribe(1)
	err := c.Execute(context.Background(), "big", nil, nil)
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("err = %v, want ErrClosed for an overlong line", err)
	}
	select {
	case <-c.Done():
	case <-time.After(time.Second):
		t.Fatal("Done not closed")
	}
	if _, ok := <-ev; ok {
		t.Error("subscription not closed")
	}
	if err := c.Execute(context.Background(), "after", nil, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("call after close: %v", err)
	}
	_ = f
}

func TestMalformedMessageEndsConnection(t *testing.T) {
	c, _ := startFake(t, func(f *fakeQEMU, r request) { f.send(`{"return": {}, "id": `) })
	if err := c.Execute(context.Background(), "x", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
}

func TestBadGreeting(t *testing.T) {
	cli, srv := net.Pipe()
	defer srv.Close()
	go srv.Write([]byte("{\"hello\": 1}\n"))
	_, err := New(context.Background(), cli, Options{})
	if err == nil || !strings.Contains(err.Error(), "not a QMP greeting") {
		t.Fatalf("err = %v", err)
	}
}

func TestGreetingTimeout(t *testing.T) {
	cli, srv := net.Pipe()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := New(ctx, cli, Options{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
}

func TestCloseFailsPendingAndIsIdempotent(t *testing.T) {
	c, _ := startFake(t, func(f *fakeQEMU, r request) {})
	errc := make(chan error, 1)
	go func() { errc <- c.Execute(context.Background(), "never", nil, nil) }()
	time.Sleep(20 * time.Millisecond)
	c.Close()
	c.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("pending call: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("pending call not failed by Close")
	}
	if err := c.Quit(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Quit after Close = %v, want ErrClosed", err)
	}
	ev, _ := c.Subscribe(1)
	if _, ok := <-ev; ok {
		t.Error("Subscribe after Close returned an open channel")
	}
}

func TestQuitToleratesHangup(t *testing.T) {
	c, f := startFake(t, func(f *fakeQEMU, r request) {
		if r.Execute == "quit" {
			f.send(`{"timestamp": {"seconds": 1, "microseconds": 0}, "event": "SHUTDOWN", "data": {"guest": false, "reason": "host-qmp-quit"}}`)
			f.conn.Close() // QEMU exits without replying
		}
	})
	ev, _ := c.Subscribe(4)
	if err := c.Quit(context.Background()); err != nil {
		t.Fatalf("Quit = %v", err)
	}
	e, ok := <-ev
	if !ok || e.Name != EventShutdown {
		t.Fatalf("event = %+v, %v", e, ok)
	}
	var d ShutdownData
	if err := json.Unmarshal(e.Data, &d); err != nil || d.Reason != "host-qmp-quit" {
		t.Errorf("shutdown data = %+v, %v", d, err)
	}
	_ = f
}
