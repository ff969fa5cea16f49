package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	guestagent "github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/agent/reaper"
	"github.com/cocoonrt/cocoon/guest/api"
)

// fakeSystem records what SyncGuest and Shutdown asked for.
type fakeSystem struct {
	mu       sync.Mutex // guards the fields below
	clock    time.Time
	entropy  []byte
	hostname string
	powerOff chan struct{}
}

func (f *fakeSystem) SetWallClock(t time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clock = t
	return nil
}

func (f *fakeSystem) AddEntropy(b []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entropy = append([]byte(nil), b...)
	return nil
}

func (f *fakeSystem) SetHostname(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hostname = name
	return nil
}

func (f *fakeSystem) PowerOff() error {
	close(f.powerOff)
	return nil
}

type harness struct {
	client  *Client
	service *guestagent.Service
	sys     *fakeSystem
}

// newHarness runs a guest agent in this process, connected to a Client
// over a socket pair.
func newHarness(t *testing.T) *harness {
	t.Helper()
	host, guest := agenttest.SocketPair(t)
	return newHarnessOn(t, host, guest, 0)
}

// newHarnessOn is newHarness on host and guest, with the agent serving
// after serveAfter.
func newHarnessOn(t *testing.T, host, guest net.Conn, serveAfter time.Duration) *harness {
	t.Helper()
	r := reaper.New(reaper.Options{})
	sys := &fakeSystem{powerOff: make(chan struct{})}
	svc, err := guestagent.New(guestagent.Config{
		System:          sys,
		Reaper:          r,
		StreamTimeout:   2 * time.Second,
		OutputDrainIdle: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	time.AfterFunc(serveAfter, func() {
		defer close(served)
		_ = svc.Serve(ctx, guest)
	})
	c, err := Connect(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		cancel()
		<-served
		guest.Close()
		r.Close()
	})
	return &harness{client: c, service: svc, sys: sys}
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func run(t *testing.T, c *Client, spec ProcessSpec) (ExitStatus, string, string) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	var stdout, stderr agenttest.Buffer
	if spec.Stdout == nil {
		spec.Stdout = &stdout
	}
	if spec.Stderr == nil && !spec.Terminal {
		spec.Stderr = &stderr
	}
	p, err := c.Start(ctx, spec)
	if err != nil {
		t.Fatalf("start %v: %v", spec.Args, err)
	}
	st, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("wait %v: %v", spec.Args, err)
	}
	return st, stdout.String(), stderr.String()
}

func TestPingAndWaitReady(t *testing.T) {
	h := newHarness(t)
	info, err := h.client.WaitReady(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if info.Version != guestagent.Version || info.KernelRelease == "" || info.Uptime <= 0 {
		t.Fatalf("unexpected info %+v", info)
	}
}

// TestConnectLateAgent: Connect waits for an agent that serves late (a
// guest still booting), and the agent answers at once after.
func TestConnectLateAgent(t *testing.T) {
	host, guest := agenttest.SocketPair(t)
	start := time.Now()
	h := newHarnessOn(t, host, guest, 1500*time.Millisecond)
	if d := time.Since(start); d < 1400*time.Millisecond {
		t.Fatalf("connected after %v, before the agent served", d)
	}
	if _, err := h.client.WaitReady(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestConnectDeadline: Connect to a guest that never answers ends with
// its context, promptly.
func TestConnectDeadline(t *testing.T) {
	host, guest := agenttest.SocketPair(t)
	defer guest.Close()
	start := time.Now()
	_, err := Connect(testCtx(t, 300*time.Millisecond), host)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline exceeded, got %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Connect returned %v after its 300ms deadline", d)
	}
}

func TestEchoExitCode(t *testing.T) {
	h := newHarness(t)
	st, out, _ := run(t, h.client, ProcessSpec{ID: "echo", Args: []string{"sh", "-c", "echo hello; exit 3"}})
	if out != "hello\n" || st.Code != 3 || st.Signal != 0 {
		t.Fatalf("got %q, %+v", out, st)
	}
	if time.Since(st.ExitedAt) > time.Minute {
		t.Fatalf("exited at %v", st.ExitedAt)
	}
}

func TestEnvCwdAndDefaultPath(t *testing.T) {
	h := newHarness(t)
	_, out, _ := run(t, h.client, ProcessSpec{ID: "env", Args: []string{"sh", "-c", `echo "$FOO|$PATH|$(pwd)"`}, Env: []string{"FOO=bar"}, Cwd: "/tmp"})
	want := "bar|" + strings.TrimPrefix(guestagent.DefaultPath, "PATH=") + "|/tmp\n"
	if out != want {
		t.Fatalf("got %q, want %q", out, want)
	}
}

func TestStderrSeparate(t *testing.T) {
	h := newHarness(t)
	st, out, errOut := run(t, h.client, ProcessSpec{ID: "err", Args: []string{"sh", "-c", "echo out; echo err >&2"}})
	if st.Code != 0 || out != "out\n" || errOut != "err\n" {
		t.Fatalf("got %+v %q %q", st, out, errOut)
	}
}

func TestStdinCat(t *testing.T) {
	h := newHarness(t)
	st, out, _ := run(t, h.client, ProcessSpec{ID: "cat", Args: []string{"cat"}, Stdin: strings.NewReader("some input\nmore\n")})
	if st.Code != 0 || out != "some input\nmore\n" {
		t.Fatalf("got %+v %q", st, out)
	}
}

func TestNoStdioIsDevNull(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	p, err := h.client.Start(ctx, ProcessSpec{ID: "null", Args: []string{"sh", "-c", "read x; test -z \"$x\" && echo x"}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 0 {
		t.Fatalf("got %+v %v", st, err)
	}
}

// hashWriter hashes what it is given.
type hashWriter struct {
	h interface {
		io.Writer
		Sum([]byte) []byte
	}
	n int64
}

func (w *hashWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return w.h.Write(p)
}

func TestLargeOutputByteExact(t *testing.T) {
	h := newHarness(t)
	const size = 50 << 20
	data := make([]byte, size)
	rand.New(rand.NewSource(1)).Read(data)
	want := sha256.Sum256(data)
	got := &hashWriter{h: sha256.New()}
	start := time.Now()
	st, _, _ := run(t, h.client, ProcessSpec{ID: "big", Args: []string{"cat"}, Stdin: bytes.NewReader(data), Stdout: got})
	if st.Code != 0 {
		t.Fatalf("exit %+v", st)
	}
	if got.n != size || !bytes.Equal(got.h.Sum(nil), want[:]) {
		t.Fatalf("got %d bytes, digest mismatch=%v", got.n, !bytes.Equal(got.h.Sum(nil), want[:]))
	}
	t.Logf("50 MiB through cat in %v", time.Since(start))
}

func TestOutputBeforeExitStatus(t *testing.T) {
	h := newHarness(t)
	// Output written right before exit must all be there when Wait returns.
	for i := range 20 {
		st, out, _ := run(t, h.client, ProcessSpec{ID: fmt.Sprintf("tail-%d", i), Args: []string{"sh", "-c", "head -c 300000 /dev/zero; exit 7"}})
		if st.Code != 7 || len(out) != 300000 {
			t.Fatalf("run %d: exit %+v, %d bytes", i, st, len(out))
		}
	}
}

func TestBackgroundChildDoesNotHoldExit(t *testing.T) {
	h := newHarness(t)
	start := time.Now()
	st, out, _ := run(t, h.client, ProcessSpec{ID: "bg", Args: []string{"sh", "-c", "sleep 30 & echo started"}})
	if st.Code != 0 || out != "started\n" {
		t.Fatalf("got %+v %q", st, out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("wait took %v", d)
	}
}

func TestSignalKill(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	p, err := h.client.Start(ctx, ProcessSpec{ID: "sleep", Args: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid() == 0 {
		t.Fatal("no pid")
	}
	if err := p.Signal(ctx, syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 137 || st.Signal != syscall.SIGKILL {
		t.Fatalf("got %+v %v", st, err)
	}
	// Waited processes are forgotten.
	if err := p.Signal(ctx, syscall.SIGKILL, false); !errdefs.IsNotFound(err) {
		t.Fatalf("signal after wait: want not found, got %v", err)
	}
	// Wait again returns the same status.
	if st2, err := p.Wait(ctx); err != nil || st2 != st {
		t.Fatalf("second wait %+v %v", st2, err)
	}
}

func TestGroupSignal(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	r, w := io.Pipe()
	p, err := h.client.Start(ctx, ProcessSpec{ID: "group", Args: []string{"sh", "-c", "sleep 100 & echo $!; wait"}, Stdout: w})
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, r)
	child, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(ctx, syscall.SIGTERM, true); err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 128+uint32(syscall.SIGTERM) {
		t.Fatalf("got %+v %v", st, err)
	}
	w.Close()
	for unix.Kill(child, 0) == nil {
		if ctx.Err() != nil {
			t.Fatalf("background child %d survived the group signal", child)
		}
		// A zombie still answers kill(0); check its state.
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child)); err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTerminal(t *testing.T) {
	h := newHarness(t)
	st, out, _ := run(t, h.client, ProcessSpec{ID: "tty", Args: []string{"tty"}, Terminal: true})
	if st.Code != 0 || !regexp.MustCompile(`^/dev/pts/\d+\r?\n$`).MatchString(out) {
		t.Fatalf("got %+v %q", st, out)
	}
	st, out, _ = run(t, h.client, ProcessSpec{ID: "size", Args: []string{"stty", "size"}, Terminal: true, Width: 100, Height: 40})
	if st.Code != 0 || strings.TrimSpace(out) != "40 100" {
		t.Fatalf("got %+v %q", st, out)
	}
}

func TestTerminalResize(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p, err := h.client.Start(ctx, ProcessSpec{
		ID: "resize", Args: []string{"sh", "-c", "stty -echo; stty size; read x; stty size"},
		Terminal: true, Width: 80, Height: 24, Stdin: inR, Stdout: outW,
	})
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(outR)
	first, err := br.ReadString('\n')
	if err != nil || strings.TrimSpace(first) != "24 80" {
		t.Fatalf("first size %q %v", first, err)
	}
	if err := p.Resize(ctx, 132, 50); err != nil {
		t.Fatal(err)
	}
	if _, err := inW.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	second, err := br.ReadString('\n')
	if err != nil || strings.TrimSpace(second) != "50 132" {
		t.Fatalf("second size %q %v", second, err)
	}
	go io.Copy(io.Discard, br)
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("got %+v %v", st, err)
	}
	inW.Close()
	outW.Close()
}

func TestResizeWithoutTerminal(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	p, err := h.client.Start(ctx, ProcessSpec{ID: "notty", Args: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(ctx, 10, 10); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("want failed precondition, got %v", err)
	}
	_ = p.Signal(ctx, syscall.SIGKILL, false)
	_, _ = p.Wait(ctx)
}

func TestCloseStdin(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	inR, inW := io.Pipe()
	var out agenttest.Buffer
	p, err := h.client.Start(ctx, ProcessSpec{ID: "closein", Args: []string{"cat"}, Stdin: inR, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inW.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	// The pipe never reaches EOF: only CloseStdin can end cat.
	if err := p.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 0 || out.String() != "abc" {
		t.Fatalf("got %+v %v %q", st, err, out.String())
	}
	inW.Close()
}

func TestDuplicateID(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	p, err := h.client.Start(ctx, ProcessSpec{ID: "dup", Args: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.client.Start(ctx, ProcessSpec{ID: "dup", Args: []string{"true"}, Stdout: io.Discard, Stderr: io.Discard})
	if !errdefs.IsAlreadyExists(err) {
		t.Fatalf("want already exists, got %v", err)
	}
	// The refused start's streams did not disturb the running process.
	_ = p.Signal(ctx, syscall.SIGKILL, false)
	if st, err := p.Wait(ctx); err != nil || st.Code != 137 {
		t.Fatalf("got %+v %v", st, err)
	}
	// Once waited, the id is free again, and the streams left over from
	// the refused start are not mistaken for the new process's.
	st, out, errOut := run(t, h.client, ProcessSpec{ID: "dup", Args: []string{"sh", "-c", "echo out; echo err >&2"}})
	if st.Code != 0 || out != "out\n" || errOut != "err\n" {
		t.Fatalf("reuse: %+v %q %q", st, out, errOut)
	}
}

func TestBadIDs(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	for _, id := range []string{"", "a b", "../x", strings.Repeat("a", 65)} {
		if _, err := h.client.Start(ctx, ProcessSpec{ID: id, Args: []string{"true"}}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("client start %q: want invalid argument, got %v", id, err)
		}
	}
	// The agent refuses them too, whatever the client checks.
	for _, id := range []string{"", "a/b", strings.Repeat("a", 65)} {
		_, err := h.client.agent.StartProcess(ctx, &api.StartProcessRequest{Id: id, Args: []string{"true"}})
		if err = h.client.mapErr("start", err); !errdefs.IsInvalidArgument(err) {
			t.Errorf("agent start %q: want invalid argument, got %v", id, err)
		}
		_, err = h.client.agent.SignalProcess(ctx, &api.SignalProcessRequest{Id: id, Signal: 9})
		if err = h.client.mapErr("signal", err); !errdefs.IsInvalidArgument(err) {
			t.Errorf("agent signal %q: want invalid argument, got %v", id, err)
		}
	}
}

func TestUnknownID(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	p := &Process{c: h.client, id: "nobody", outputDone: make(chan struct{}), stdinSem: make(chan struct{}, 1), stdinCopied: make(chan struct{}), waitSem: make(chan struct{}, 1)}
	close(p.outputDone)
	// Before a Wait, since the agent forgets a process once waited for.
	if err := p.CloseStdin(ctx); !errdefs.IsNotFound(err) {
		t.Errorf("close stdin: want not found, got %v", err)
	}
	if _, err := p.Wait(ctx); !errdefs.IsNotFound(err) {
		t.Errorf("wait: want not found, got %v", err)
	}
	if err := p.Signal(ctx, syscall.SIGTERM, false); !errdefs.IsNotFound(err) {
		t.Errorf("signal: want not found, got %v", err)
	}
	if err := p.Resize(ctx, 1, 1); !errdefs.IsNotFound(err) {
		t.Errorf("resize: want not found, got %v", err)
	}
}

// TestCloseStdinAfterExit: a process whose stdin reached EOF exits, is
// waited for and forgotten by the agent; closing its stdin then is not an
// error (containerd's client calls CloseIO once its copy of stdin ends,
// whether or not the process is still there).
func TestCloseStdinAfterExit(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	var out agenttest.Buffer
	p, err := h.client.Start(ctx, ProcessSpec{ID: "ateof", Args: []string{"cat"}, Stdin: strings.NewReader("abc"), Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 0 || out.String() != "abc" {
		t.Fatalf("got %+v %v %q", st, err, out.String())
	}
	if err := p.CloseStdin(ctx); err != nil {
		t.Fatalf("close stdin after the process was waited for: %v", err)
	}
}

func TestExecNotFound(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	_, err := h.client.Start(ctx, ProcessSpec{ID: "missing", Args: []string{"no-such-program-xyz"}, Stdout: io.Discard})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("want not found, got %v", err)
	}
	// The id was not kept.
	st, _, _ := run(t, h.client, ProcessSpec{ID: "missing", Args: []string{"true"}})
	if st.Code != 0 {
		t.Fatalf("%+v", st)
	}
}

func TestMalformedHeaderDropped(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	for _, junk := range [][]byte{[]byte("HTTP/1.1 GET /\r\n"), []byte("CCN1\x09\x00"), []byte("CCN1\x02\xff")} {
		s, err := h.client.sess.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write(junk); err != nil {
			t.Fatal(err)
		}
		// The agent closes the stream: we read EOF.
		_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, s); err != nil {
			t.Fatalf("junk %q: stream not closed by the agent: %v", junk, err)
		}
		s.Close()
	}
	if _, err := h.client.Ping(ctx); err != nil {
		t.Fatalf("session harmed: %v", err)
	}
	st, out, _ := run(t, h.client, ProcessSpec{ID: "after", Args: []string{"echo", "ok"}})
	if st.Code != 0 || out != "ok\n" {
		t.Fatalf("got %+v %q", st, out)
	}
}

func TestManyConcurrentProcesses(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 60*time.Second)
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out, errOut agenttest.Buffer
			id := fmt.Sprintf("p%d", i)
			p, err := h.client.Start(ctx, ProcessSpec{ID: id, Args: []string{"sh", "-c", "echo $0; echo e$0 >&2; exit $(($1 % 7))", id, strconv.Itoa(i)}, Stdin: strings.NewReader("x"), Stdout: &out, Stderr: &errOut})
			if err != nil {
				errs <- err
				return
			}
			st, err := p.Wait(ctx)
			if err != nil {
				errs <- err
				return
			}
			if out.String() != id+"\n" || errOut.String() != "e"+id+"\n" || st.Code != uint32(i%7) {
				errs <- fmt.Errorf("%s: %q %q %+v", id, out.String(), errOut.String(), st)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// slowWriter accepts output slowly, like a host whose consumer lags.
type slowWriter struct{ n int64 }

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(20 * time.Millisecond)
	w.n += int64(len(p))
	return len(p), nil
}

func TestChattyProcessDoesNotBlockPing(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 30*time.Second)
	sw := &slowWriter{}
	p, err := h.client.Start(ctx, ProcessSpec{ID: "chatty", Args: []string{"cat", "/dev/zero"}, Stdout: sw})
	if err != nil {
		t.Fatal(err)
	}
	// Let the stream window and the pipe fill up.
	time.Sleep(300 * time.Millisecond)
	var worst time.Duration
	for range 10 {
		start := time.Now()
		if _, err := h.client.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		worst = max(worst, time.Since(start))
	}
	if worst > time.Second {
		t.Fatalf("ping took %v while a process flooded its stdout", worst)
	}
	t.Logf("worst ping %v while flooding", worst)
	if err := p.Signal(ctx, syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(ctx); err != nil || st.Code != 137 {
		t.Fatalf("got %+v %v", st, err)
	}
}

func TestSyncGuest(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	now := time.Unix(1700000000, 123)
	info, err := h.client.SyncGuest(ctx, GuestSync{WallTime: now, Entropy: []byte("0123456789"), Hostname: "box"})
	if err != nil {
		t.Fatal(err)
	}
	// Its answer is the guest's, as a ping's.
	if info.Version == "" || info.KernelRelease == "" {
		t.Errorf("sync answered %+v, want the guest's version and kernel", info)
	}
	h.sys.mu.Lock()
	if !h.sys.clock.Equal(now) || string(h.sys.entropy) != "0123456789" || h.sys.hostname != "box" {
		t.Errorf("system got %v %q %q", h.sys.clock, h.sys.entropy, h.sys.hostname)
	}
	h.sys.mu.Unlock()
	if _, err := h.client.SyncGuest(ctx, GuestSync{Entropy: make([]byte, 513)}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("oversized entropy: want invalid argument, got %v", err)
	}
	// A sandbox named after a 76-character containerd id: its first 64.
	if _, err := h.client.SyncGuest(ctx, GuestSync{Hostname: strings.Repeat("h", 64) + "-and-more-id"}); err != nil {
		t.Errorf("long hostname: %v", err)
	}
	h.sys.mu.Lock()
	if h.sys.hostname != strings.Repeat("h", 64) {
		t.Errorf("long hostname set as %q, want its first 64 bytes", h.sys.hostname)
	}
	h.sys.mu.Unlock()
}

func TestShutdown(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	if err := h.client.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.sys.powerOff:
	case <-ctx.Done():
		t.Fatal("no power-off after Shutdown")
	}
}

func TestClosedSessionIsUnavailable(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 10*time.Second)
	h.client.Close()
	if _, err := h.client.Ping(ctx); !errdefs.IsUnavailable(err) {
		t.Fatalf("want unavailable, got %v", err)
	}
	if _, err := h.client.Start(ctx, ProcessSpec{ID: "x", Args: []string{"true"}, Stdout: io.Discard}); !errdefs.IsUnavailable(err) {
		t.Fatalf("want unavailable, got %v", err)
	}
}

func TestGuestOpenedStreamEndsSession(t *testing.T) {
	host, guest := agenttest.SocketPair(t)
	// A rogue guest: a yamux server that opens a stream of its own.
	opened := make(chan error, 1)
	go func() {
		sess, err := yamuxServerForTest(guest)
		if err == nil {
			t.Cleanup(func() { sess.Close() })
			_, err = sess.OpenStream()
		}
		opened <- err
	}()
	c, err := Connect(testCtx(t, 10*time.Second), host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := <-opened; err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("session survived a guest-opened stream")
	}
}
