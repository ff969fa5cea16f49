package portfwd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/reexec"

	"github.com/cocoonrt/cocoon/runtime/network"
)

// TestMain runs the namespace holder when the test binary is re-executed
// as one (network.NewNamespace).
func TestMain(m *testing.M) {
	if reexec.Init() {
		return
	}
	os.Exit(m.Run())
}

// newNamespace makes a network namespace with its loopback up, for the
// test's life, and returns its path.
func newNamespace(t *testing.T) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("network namespaces need root")
	}
	h, err := network.NewNamespace(filepath.Join(t.TempDir(), "netns"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h.Path()
}

func needIPTables(t *testing.T) {
	t.Helper()
	for _, cmd := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(cmd); err != nil {
			t.Skipf("%s not found", cmd)
		}
	}
}

// fakeGuest stands for a guest's loopback: an echo server in the test's
// own namespace, which a dial reaches after saying what it was asked
// for ("dialed <port> v4|v6\n"), which the server echoes back first.
type fakeGuest struct {
	addr string
	// refuse makes a dial of the family fail as nothing listens there.
	refuse map[bool]bool
	// block makes every dial wait for its context's end.
	block bool

	mu    sync.Mutex // guards dials
	dials []string
}

func newFakeGuest(t *testing.T) *fakeGuest {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return &fakeGuest{addr: ln.Addr().String(), refuse: map[bool]bool{}}
}

func (g *fakeGuest) dial(ctx context.Context, port uint16, ipv6 bool) (net.Conn, error) {
	what := fmt.Sprintf("dialed %d %s", port, familyName(ipv6))
	g.mu.Lock()
	g.dials = append(g.dials, what)
	g.mu.Unlock()
	if g.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if g.refuse[ipv6] {
		return nil, fmt.Errorf("nothing listens: %w", errdefs.ErrNotFound)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp4", g.addr)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(c, what+"\n"); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (g *fakeGuest) dialed() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.dials...)
}

func familyName(ipv6 bool) string {
	if ipv6 {
		return "v6"
	}
	return "v4"
}

// dialIn connects to addr from inside the namespace at nsPath.
func dialIn(t *testing.T, nsPath, addr string) (*net.TCPConn, error) {
	t.Helper()
	var c net.Conn
	err := network.InNamespace(nsPath, func() (err error) {
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn), nil
}

// rules lists the nat OUTPUT rules of both families in the namespace.
func rules(t *testing.T, nsPath string) string {
	t.Helper()
	var out strings.Builder
	for _, cmd := range []string{"iptables", "ip6tables"} {
		err := network.InNamespace(nsPath, func() error {
			b, err := exec.Command(cmd, "-w", "5", "-t", "nat", "-S", "OUTPUT").CombinedOutput()
			out.Write(b)
			return err
		})
		if err != nil {
			t.Fatalf("%s -S: %v: %s", cmd, err, out.String())
		}
	}
	return out.String()
}

func start(t *testing.T, nsPath string, g *fakeGuest, o Options) *Forwarder {
	t.Helper()
	f, err := Start(context.Background(), nsPath, g.dial, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// expectEcho checks that c was forwarded as first says, then echoes,
// and that a half-close comes back as EOF.
func expectEcho(t *testing.T, c *net.TCPConn, first string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil || line != first+"\n" {
		t.Fatalf("first line %q, %v; want %q", line, err, first)
	}
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	if err != nil || string(rest) != "ping" {
		t.Fatalf("echo %q, %v; want ping and EOF", rest, err)
	}
}

func TestForwardBothFamilies(t *testing.T) {
	needIPTables(t)
	ns := newNamespace(t)
	g := newFakeGuest(t)
	f := start(t, ns, g, Options{})
	if f.Port(false) == 0 || f.Port(true) == 0 {
		t.Fatalf("ports %d and %d: want both families", f.Port(false), f.Port(true))
	}
	got := rules(t, ns)
	for _, want := range []string{
		fmt.Sprintf("-A OUTPUT -d 127.0.0.1/32 -o lo -p tcp -m tcp ! --dport %d -m comment --comment \"cocoon port-forward\" -j REDIRECT --to-ports %d", f.Port(false), f.Port(false)),
		fmt.Sprintf("-A OUTPUT -d ::1/128 -o lo -p tcp -m tcp ! --dport %d -m comment --comment \"cocoon port-forward\" -j REDIRECT --to-ports %d", f.Port(true), f.Port(true)),
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("rules:\n%s\nwant %s", got, want)
		}
	}
	for _, tc := range []struct {
		addr, first string
	}{
		{"127.0.0.1:8080", "dialed 8080 v4"},
		{"[::1]:8081", "dialed 8081 v6"},
		{"localhost:443", "dialed 443 v4"},
		// The listener's own port is not redirected: a client that
		// dialed it meant it.
		{fmt.Sprintf("127.0.0.1:%d", f.Port(false)), fmt.Sprintf("dialed %d v4", f.Port(false))},
		{fmt.Sprintf("[::1]:%d", f.Port(true)), fmt.Sprintf("dialed %d v6", f.Port(true))},
	} {
		c, err := dialIn(t, ns, tc.addr)
		if err != nil {
			t.Fatalf("%s: %v", tc.addr, err)
		}
		expectEcho(t, c, tc.first)
	}

	if err := f.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if got := rules(t, ns); strings.Contains(got, ruleComment) {
		t.Fatalf("rules left after close:\n%s", got)
	}
	for _, addr := range []string{"127.0.0.1:8080", fmt.Sprintf("127.0.0.1:%d", f.Port(false)), fmt.Sprintf("[::1]:%d", f.Port(true))} {
		if c, err := dialIn(t, ns, addr); err == nil {
			c.Close()
			t.Fatalf("%s: connected after close", addr)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestForwardFallsBackToGuestIPv6(t *testing.T) {
	needIPTables(t)
	ns := newNamespace(t)
	g := newFakeGuest(t)
	g.refuse[false] = true
	start(t, ns, g, Options{})
	c, err := dialIn(t, ns, "127.0.0.1:9000")
	if err != nil {
		t.Fatal(err)
	}
	expectEcho(t, c, "dialed 9000 v6")
	if d := g.dialed(); strings.Join(d, ",") != "dialed 9000 v4,dialed 9000 v6" {
		t.Fatalf("dials %q", d)
	}
}

func TestForwardGuestRefuses(t *testing.T) {
	needIPTables(t)
	ns := newNamespace(t)
	g := newFakeGuest(t)
	g.refuse[false], g.refuse[true] = true, true
	start(t, ns, g, Options{})
	for _, addr := range []string{"127.0.0.1:9000", "[::1]:9000"} {
		c, err := dialIn(t, ns, addr)
		if err != nil {
			t.Fatal(err)
		}
		// The client connected (to the listener), and is closed without
		// a byte.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
			t.Fatalf("%s: read %q, %v; want EOF", addr, b, err)
		}
	}
}

func TestForwardBoundsConnectionsAndDials(t *testing.T) {
	needIPTables(t)
	ns := newNamespace(t)
	g := newFakeGuest(t)
	g.block = true
	const dialTimeout = 700 * time.Millisecond
	start(t, ns, g, Options{MaxConns: 2, DialTimeout: dialTimeout})
	var held []*net.TCPConn
	for range 2 {
		c, err := dialIn(t, ns, "127.0.0.1:9000")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	waitFor(t, func() bool { return len(g.dialed()) == 2 })
	// The third is closed at once: two are in flight.
	began := time.Now()
	c, err := dialIn(t, ns, "127.0.0.1:9000")
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("third connection: %v, want EOF", err)
	}
	if took := time.Since(began); took >= dialTimeout {
		t.Fatalf("third connection closed after %v, not at once", took)
	}
	// The first two are closed when their dials time out.
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("held connection: %v, want EOF", err)
		}
	}
	if n := len(g.dialed()); n != 2 {
		t.Fatalf("%d dials, want 2", n)
	}
}

func TestForwardCloseEndsConnections(t *testing.T) {
	needIPTables(t)
	ns := newNamespace(t)
	g := newFakeGuest(t)
	f := start(t, ns, g, Options{})
	c, err := dialIn(t, ns, "127.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close did not end a forwarded connection")
	}
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("the client's connection after close: %v, want EOF", err)
	}
}

func TestForwardWithoutIPTables(t *testing.T) {
	needIPTables(t)
	ns := newNamespace(t)
	g := newFakeGuest(t)
	_, err := Start(context.Background(), ns, g.dial, Options{IPTables: "cocoon-no-iptables", IP6Tables: "cocoon-no-ip6tables"})
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "cocoon-no-iptables") || !strings.Contains(err.Error(), "cocoon-no-ip6tables") {
		t.Fatalf("start without iptables: %v; want not found, naming both", err)
	}
	// Without iptables for IPv4, IPv6 is forwarded all the same.
	f := start(t, ns, g, Options{IPTables: "cocoon-no-iptables"})
	if f.Port(false) != 0 || f.Port(true) == 0 {
		t.Fatalf("ports %d and %d: want IPv6 only", f.Port(false), f.Port(true))
	}
	if got := rules(t, ns); strings.Contains(got, "127.0.0.1") {
		t.Fatalf("an IPv4 rule without iptables:\n%s", got)
	}
	c, err := dialIn(t, ns, "[::1]:8080")
	if err != nil {
		t.Fatal(err)
	}
	expectEcho(t, c, "dialed 8080 v6")
}

func TestForwardNamespacePathGone(t *testing.T) {
	needIPTables(t)
	if os.Getuid() != 0 {
		t.Skip("network namespaces need root")
	}
	h, err := network.NewNamespace(filepath.Join(t.TempDir(), "netns"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// The test keeps the namespace to look into it after its path went.
	keep, err := os.Open(h.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	kept := fmt.Sprintf("/proc/self/fd/%d", keep.Fd())
	g := newFakeGuest(t)
	f, err := Start(context.Background(), h.Path(), g.dial, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(h.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("namespace file: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close after the namespace's path went: %v", err)
	}
	if got := rules(t, kept); strings.Contains(got, ruleComment) {
		t.Fatalf("rules left:\n%s", got)
	}
}

func TestStartNoNamespace(t *testing.T) {
	_, err := Start(context.Background(), filepath.Join(t.TempDir(), "none"), nil, Options{})
	if !errdefs.IsNotFound(err) {
		t.Fatalf("start on a missing namespace: %v, want not found", err)
	}
}

func TestOriginalPortWithoutNAT(t *testing.T) {
	ns := newNamespace(t)
	// No rule in this namespace: conntrack knows nothing of the
	// connection, and the port dialed is the listener's.
	var ln *net.TCPListener
	if err := network.InNamespace(ns, func() (err error) {
		ln, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := dialIn(t, ns, ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	c, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	port, err := originalPort(c, false)
	if err != nil || int(port) != ln.Addr().(*net.TCPAddr).Port {
		t.Fatalf("original port %d, %v; want %d", port, err, ln.Addr().(*net.TCPAddr).Port)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
