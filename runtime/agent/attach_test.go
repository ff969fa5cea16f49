package agent

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	guestagent "github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/agent/reaper"
	"github.com/cocoonrt/cocoon/guest/api"
)

// guestOfSessions is one guest agent that host sessions connect to one
// after another, as the host of a restored VM, or a restarted shim, does.
type guestOfSessions struct {
	svc *guestagent.Service
}

func newGuestOfSessions(t *testing.T, cfg guestagent.Config) *guestOfSessions {
	t.Helper()
	r := reaper.New(reaper.Options{})
	t.Cleanup(r.Close)
	cfg.System = &fakeSystem{powerOff: make(chan struct{})}
	cfg.Reaper = r
	if cfg.StreamTimeout == 0 {
		cfg.StreamTimeout = 2 * time.Second
	}
	if cfg.OutputDrainIdle == 0 {
		cfg.OutputDrainIdle = 300 * time.Millisecond
	}
	svc, err := guestagent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &guestOfSessions{svc: svc}
}

// hostSession is one session of a guestOfSessions.
type hostSession struct {
	c *Client
	// served is closed once the guest's side of the session has ended.
	served chan struct{}
	cancel context.CancelFunc
}

func (g *guestOfSessions) connect(t *testing.T) *hostSession {
	t.Helper()
	host, guest := agenttest.SocketPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := &hostSession{served: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(s.served)
		_ = g.svc.Serve(ctx, guest)
	}()
	c, err := Connect(ctx, host)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s.c = c
	t.Cleanup(func() {
		c.Close()
		cancel()
		<-s.served
		guest.Close()
	})
	return s
}

// settleWrites is how long a test lets the guest's writes of what its
// host has read return before it ends the session: yamux cannot tell
// whether a write still waiting for its answer when the session ends was
// sent, and the agent takes it for unsent, so its bytes would go to the
// next session too (at least once).
const settleWrites = 100 * time.Millisecond

// lose ends the session from the host's side, as a host that died or a
// VM restored from a snapshot does, and returns once the guest has seen
// its end.
func (s *hostSession) lose(t *testing.T) {
	t.Helper()
	time.Sleep(settleWrites)
	s.c.Close()
	select {
	case <-s.served:
	case <-time.After(10 * time.Second):
		t.Fatal("the guest did not see its session end")
	}
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gate is a file the processes of a test wait for: the test opens it.
type gate string

func newGate(t *testing.T) gate { return gate(filepath.Join(t.TempDir(), "go")) }

// wait is the shell that waits for the gate.
func (g gate) wait() string {
	return fmt.Sprintf("while [ ! -e %s ]; do sleep 0.01; done", g)
}

func (g gate) open(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(string(g), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// numbers is what `seq 1 n` prints.
func numbers(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.String()
}

// TestAttachOutputWrittenWhileDetached: the output a process writes after
// its session ended, more than its pipe holds, waits in the guest (the
// process blocked on the full pipe) and reaches a new session's
// AttachProcess whole and in order, after what the old session got.
func TestAttachOutputWrittenWhileDetached(t *testing.T) {
	g := newGuestOfSessions(t, guestagent.Config{})
	ctx := testCtx(t, 30*time.Second)
	gate := newGate(t)
	const n = 100000 // about 590 KB: several pipes' worth
	old := g.connect(t)
	var out1, err1 agenttest.Buffer
	if _, err := old.c.Start(ctx, ProcessSpec{ID: "lines", Args: []string{"sh", "-c", "echo first; echo e1 >&2; " + gate.wait() + "; seq 1 " + fmt.Sprint(n) + "; echo e2 >&2"},
		Stdout: &out1, Stderr: &err1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first line", func() bool { return out1.String() == "first\n" && err1.String() == "e1\n" })
	old.lose(t)
	gate.open(t)

	// Long enough for the process to fill its pipe and block.
	time.Sleep(300 * time.Millisecond)
	s := g.connect(t)
	// The exit is held back with the output.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := s.c.agent.WaitProcess(short, &api.WaitProcessRequest{Id: "lines"})
	cancel()
	if err == nil {
		t.Fatal("WaitProcess answered while the output waited for its host")
	}
	var out2, err2 agenttest.Buffer
	p, err := s.c.AttachProcess(ctx, AttachSpec{ID: "lines", Stdout: &out2, Stderr: &err2})
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid() == 0 || p.ID() != "lines" {
		t.Fatalf("attached process %s pid %d", p.ID(), p.Pid())
	}
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 0 {
		t.Fatalf("wait: %+v %v", st, err)
	}
	if out1.String() != "first\n" || err1.String() != "e1\n" {
		t.Fatalf("the old session got more: %q %q", out1.String(), err1.String())
	}
	if got, want := out2.String(), numbers(n); got != want {
		t.Fatalf("attached stdout: %d bytes, want %d (prefix %q)", len(got), len(want), got[:min(len(got), 40)])
	}
	if err2.String() != "e2\n" {
		t.Fatalf("attached stderr %q", err2.String())
	}
}

// TestAttachKeepsOrderAcrossLostSession: a session lost while a process
// prints: what the new session gets continues what the old one got, in
// order, to the end. Between the two, what was on its way to the old host
// when it went (in the dead session's buffers) may be missing, and the
// write in flight then may come twice.
func TestAttachKeepsOrderAcrossLostSession(t *testing.T) {
	g := newGuestOfSessions(t, guestagent.Config{})
	ctx := testCtx(t, 30*time.Second)
	const n = 20000
	old := g.connect(t)
	var out1 agenttest.Buffer
	script := fmt.Sprintf("i=1; while [ $i -le %d ]; do echo $i; i=$((i+1)); done", n)
	if _, err := old.c.Start(ctx, ProcessSpec{ID: "printer", Args: []string{"sh", "-c", script}, Stdout: &out1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "some output", func() bool { return len(out1.String()) > 1000 })
	// Lost mid-stream, without the settling of lose.
	old.c.Close()
	<-old.served
	s := g.connect(t)
	var out2 agenttest.Buffer
	p, err := s.c.AttachProcess(ctx, AttachSpec{ID: "printer", Stdout: &out2})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("wait: %+v %v", st, err)
	}
	all, got1, got2 := numbers(n), out1.String(), out2.String()
	if !strings.HasPrefix(all, got1) {
		t.Fatalf("the old session's output is not a prefix of the whole")
	}
	if !strings.HasSuffix(all, got2) || len(got2) == 0 {
		t.Fatalf("the new session's output (%d bytes) is not the end of the whole", len(got2))
	}
	t.Logf("old session %d bytes, new %d, of %d", len(got1), len(got2), len(all))
}

// TestAttachStdin: stdin that was attached in a lost session is taken up
// by the new session's stream; its EOF then closes the process's stdin.
func TestAttachStdin(t *testing.T) {
	g := newGuestOfSessions(t, guestagent.Config{})
	ctx := testCtx(t, 30*time.Second)
	old := g.connect(t)
	in1R, in1W := io.Pipe()
	defer in1W.Close()
	var out1 agenttest.Buffer
	if _, err := old.c.Start(ctx, ProcessSpec{ID: "cat", Args: []string{"cat"}, Stdin: in1R, Stdout: &out1}); err != nil {
		t.Fatal(err)
	}
	if _, err := in1W.Write([]byte("one\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first line echoed", func() bool { return out1.String() == "one\n" })
	old.lose(t)

	s := g.connect(t)
	var out2 agenttest.Buffer
	p, err := s.c.AttachProcess(ctx, AttachSpec{ID: "cat", Stdin: strings.NewReader("two\n"), Stdout: &out2})
	if err != nil {
		t.Fatal(err)
	}
	// The reader's EOF is the process's: cat ends.
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 0 {
		t.Fatalf("wait: %+v %v", st, err)
	}
	if out2.String() != "two\n" {
		t.Fatalf("attached stdout %q", out2.String())
	}
}

// TestAttachTerminal: a process on a terminal keeps its pty across a lost
// session; the new session's streams carry its input and output.
func TestAttachTerminal(t *testing.T) {
	g := newGuestOfSessions(t, guestagent.Config{})
	ctx := testCtx(t, 30*time.Second)
	old := g.connect(t)
	in1R, in1W := io.Pipe()
	defer in1W.Close()
	var out1 agenttest.Buffer
	script := `stty -echo; echo ready; read a; echo "got $a"; read b; echo "got $b"`
	if _, err := old.c.Start(ctx, ProcessSpec{ID: "tty", Args: []string{"sh", "-c", script}, Terminal: true, Stdin: in1R, Stdout: &out1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the terminal ready", func() bool { return strings.Contains(out1.String(), "ready") })
	if _, err := in1W.Write([]byte("x\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first answer", func() bool { return strings.Contains(out1.String(), "got x") })
	old.lose(t)

	s := g.connect(t)
	if _, err := s.c.AttachProcess(ctx, AttachSpec{ID: "tty", Terminal: true, Stdout: io.Discard, Stderr: io.Discard}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a terminal with stderr: want invalid argument, got %v", err)
	}
	in2R, in2W := io.Pipe()
	defer in2W.Close()
	var out2 agenttest.Buffer
	p, err := s.c.AttachProcess(ctx, AttachSpec{ID: "tty", Terminal: true, Stdin: in2R, Stdout: &out2})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(ctx, 100, 30); err != nil {
		t.Fatal(err)
	}
	if _, err := in2W.Write([]byte("y\n")); err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 0 {
		t.Fatalf("wait: %+v %v", st, err)
	}
	if got := out2.String(); !strings.Contains(got, "got y") || strings.Contains(got, "got x") {
		t.Fatalf("attached terminal output %q", got)
	}
}

// TestAttachAfterExit: a process that exited while detached keeps its
// last output and its status for the new session: attach, get the
// output, then Wait gives the status.
func TestAttachAfterExit(t *testing.T) {
	g := newGuestOfSessions(t, guestagent.Config{})
	ctx := testCtx(t, 30*time.Second)
	gate := newGate(t)
	old := g.connect(t)
	var out1 agenttest.Buffer
	if _, err := old.c.Start(ctx, ProcessSpec{ID: "last", Args: []string{"sh", "-c", "echo a; " + gate.wait() + "; echo b; exit 7"}, Stdout: &out1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first line", func() bool { return out1.String() == "a\n" })
	old.lose(t)
	gate.open(t)
	// Exited, but its output waits.
	time.Sleep(200 * time.Millisecond)

	s := g.connect(t)
	var out2 agenttest.Buffer
	p, err := s.c.AttachProcess(ctx, AttachSpec{ID: "last", Stdout: &out2})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 7 {
		t.Fatalf("wait: %+v %v", st, err)
	}
	if out2.String() != "b\n" {
		t.Fatalf("attached stdout %q", out2.String())
	}
	// Waited for: gone.
	if _, err := s.c.AttachProcess(ctx, AttachSpec{ID: "last"}); !errdefs.IsNotFound(err) {
		t.Fatalf("attach after wait: want not found, got %v", err)
	}
}

// TestAttachTimeoutDiscards: output that no session takes within
// ReattachTimeout is discarded, and the exit is reported then.
func TestAttachTimeoutDiscards(t *testing.T) {
	const timeout = 400 * time.Millisecond
	g := newGuestOfSessions(t, guestagent.Config{ReattachTimeout: timeout})
	ctx := testCtx(t, 30*time.Second)
	gate := newGate(t)
	old := g.connect(t)
	var out1 agenttest.Buffer
	if _, err := old.c.Start(ctx, ProcessSpec{ID: "lost", Args: []string{"sh", "-c", "echo a; " + gate.wait() + "; seq 1 100000; exit 3"}, Stdout: &out1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first line", func() bool { return out1.String() == "a\n" })
	old.lose(t)
	s := g.connect(t)
	opened := time.Now()
	gate.open(t)
	resp, err := s.c.agent.WaitProcess(ctx, &api.WaitProcessRequest{Id: "lost"})
	if err != nil || resp.ExitStatus != 3 {
		t.Fatalf("wait: %v %v", resp, err)
	}
	if d := time.Since(opened); d < timeout*3/4 {
		t.Fatalf("the exit came %v after the output, before the reattach timeout of %v", d, timeout)
	}
}

// TestAttachErrors: unknown ids, and kinds the process was started
// without.
func TestAttachErrors(t *testing.T) {
	g := newGuestOfSessions(t, guestagent.Config{})
	ctx := testCtx(t, 30*time.Second)
	s := g.connect(t)
	if _, err := s.c.AttachProcess(ctx, AttachSpec{ID: "nope", Stdout: io.Discard}); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown id: want not found, got %v", err)
	}
	if _, err := s.c.AttachProcess(ctx, AttachSpec{ID: "bad/id"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad id: want invalid argument, got %v", err)
	}
	var out agenttest.Buffer
	p, err := s.c.Start(ctx, ProcessSpec{ID: "noout", Args: []string{"sleep", "100"}, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []AttachSpec{
		{ID: "noout", Stdout: io.Discard},
		{ID: "noout", Stdin: strings.NewReader("")},
	} {
		_, err := s.c.AttachProcess(ctx, spec)
		kind := "stdout"
		if spec.Stdin != nil {
			kind = "stdin"
		}
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), kind) {
			t.Fatalf("attach %s it was started without: want invalid argument naming it, got %v", kind, err)
		}
	}
	// The refused attaches left the process as it was.
	if err := p.Signal(ctx, syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(ctx); err != nil || st.Signal != syscall.SIGKILL {
		t.Fatalf("wait: %+v %v", st, err)
	}
	if _, err := s.c.AttachProcess(ctx, AttachSpec{ID: "noout"}); !errdefs.IsNotFound(err) {
		t.Fatalf("waited-for id: want not found, got %v", err)
	}
}

// TestAttachDetachesWhatIsNotAsked: kinds an AttachProcess leaves out are
// detached: output discarded, stdin at EOF.
func TestAttachDetachesWhatIsNotAsked(t *testing.T) {
	g := newGuestOfSessions(t, guestagent.Config{})
	ctx := testCtx(t, 30*time.Second)
	gate := newGate(t)
	old := g.connect(t)
	inR, inW := io.Pipe()
	defer inW.Close()
	var out1, err1 agenttest.Buffer
	// cat reads stdin until EOF; then the rest shows what reached which
	// stream.
	script := "echo ready; cat; echo out; echo err >&2; " + gate.wait() + "; echo end"
	if _, err := old.c.Start(ctx, ProcessSpec{ID: "part", Args: []string{"sh", "-c", script}, Stdin: inR, Stdout: &out1, Stderr: &err1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready", func() bool { return out1.String() == "ready\n" })
	old.lose(t)
	s := g.connect(t)
	var err2 agenttest.Buffer
	p, err := s.c.AttachProcess(ctx, AttachSpec{ID: "part", Stderr: &err2})
	if err != nil {
		t.Fatal(err)
	}
	gate.open(t)
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("wait: %+v %v", st, err)
	}
	if err2.String() != "err\n" || out1.String() != "ready\n" {
		t.Fatalf("stderr %q, old stdout %q", err2.String(), out1.String())
	}
}

// TestWaitFromNewSession: a process started in a session that was lost
// while a WaitProcess of it was in flight is waited for from the next
// session.
func TestWaitFromNewSession(t *testing.T) {
	g := newGuestOfSessions(t, guestagent.Config{})
	ctx := testCtx(t, 30*time.Second)
	gate := newGate(t)
	old := g.connect(t)
	p1, err := old.c.Start(ctx, ProcessSpec{ID: "quiet", Args: []string{"sh", "-c", gate.wait() + "; exit 5"}})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := p1.Wait(ctx)
		waited <- err
	}()
	// The WaitProcess is in the guest before the session goes.
	time.Sleep(100 * time.Millisecond)
	old.lose(t)
	if err := <-waited; !errdefs.IsUnavailable(err) {
		t.Fatalf("wait in the lost session: want unavailable, got %v", err)
	}
	gate.open(t)
	s := g.connect(t)
	p2, err := s.c.AttachProcess(ctx, AttachSpec{ID: "quiet"})
	if err != nil {
		t.Fatal(err)
	}
	if p2.Pid() != p1.Pid() {
		t.Fatalf("attached pid %d, started %d", p2.Pid(), p1.Pid())
	}
	if st, err := p2.Wait(ctx); err != nil || st.Code != 5 {
		t.Fatalf("wait: %+v %v", st, err)
	}
}

// TestAttachReplacesLiveStreams: an AttachProcess while the old session
// still lives takes the output over from it; the old stream ends.
func TestAttachReplacesLiveStreams(t *testing.T) {
	g := newGuestOfSessions(t, guestagent.Config{})
	ctx := testCtx(t, 30*time.Second)
	gate := newGate(t)
	old := g.connect(t)
	var out1 agenttest.Buffer
	p1, err := old.c.Start(ctx, ProcessSpec{ID: "moved", Args: []string{"sh", "-c", "echo a; " + gate.wait() + "; echo b"}, Stdout: &out1})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first line", func() bool { return out1.String() == "a\n" })
	s := g.connect(t)
	var out2 agenttest.Buffer
	p2, err := s.c.AttachProcess(ctx, AttachSpec{ID: "moved", Stdout: &out2})
	if err != nil {
		t.Fatal(err)
	}
	// The old session's copy ends: its stream was closed.
	select {
	case <-p1.outputDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the old stream did not end")
	}
	gate.open(t)
	if st, err := p2.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("wait: %+v %v", st, err)
	}
	if out1.String() != "a\n" || out2.String() != "b\n" {
		t.Fatalf("old %q, new %q", out1.String(), out2.String())
	}
	if _, err := p1.Wait(ctx); !errdefs.IsNotFound(err) {
		t.Fatalf("wait in the old session after the new one did: want not found, got %v", err)
	}
}
