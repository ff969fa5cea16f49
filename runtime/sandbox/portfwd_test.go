package sandbox

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/network"
)

// TestSandboxForwardsPorts starts a sandbox that mirrors a namespace and
// connects to a port of the namespace's loopback, which reaches the
// fake guest's loopback: this process's, where a server says hello.
func TestSandboxForwardsPorts(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("network namespaces need root")
	}
	for _, cmd := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(cmd); err != nil {
			t.Skipf("%s not found", cmd)
		}
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "cocoon-pf-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	path := "/run/netns/" + name
	if err := network.InNamespace(path, func() error { return exec.Command("ip", "link", "set", "lo", "up").Run() }); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "hello\n")
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	d := &fakeDriver{mode: guestServes}
	o := testOptions(t, d)
	o.NetNS = path
	sb, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Stop(context.Background())
	if sb.host.ports == nil {
		t.Fatal("no port forwarding")
	}
	c, err := dialInNamespace(path, fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if err != nil || line != "hello\n" {
		t.Fatalf("read %q, %v", line, err)
	}
	// Nothing listens on the guest's port 1: the client is closed.
	if c, err := dialInNamespace(path, "127.0.0.1:1"); err == nil {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
			t.Fatalf("port 1: read %q, %v; want EOF", b, err)
		}
		c.Close()
	}
	if _, err := sb.DialGuestPort(context.Background(), 1, false); !errdefs.IsNotFound(err) {
		t.Fatalf("dial port 1: %v, want not found", err)
	}

	if err := sb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	var rules []byte
	err = network.InNamespace(path, func() (err error) {
		rules, err = exec.Command("iptables", "-w", "5", "-t", "nat", "-S", "OUTPUT").CombinedOutput()
		return err
	})
	if err != nil || strings.Contains(string(rules), "cocoon") {
		t.Fatalf("rules after stop: %v:\n%s", err, rules)
	}
	if c, err := dialInNamespace(path, fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
		c.Close()
		t.Fatal("connected after stop")
	}
	if _, err := sb.DialGuestPort(context.Background(), uint16(port), false); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("dial after stop: %v, want unavailable", err)
	}
}

func dialInNamespace(path, addr string) (net.Conn, error) {
	var c net.Conn
	err := network.InNamespace(path, func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, 5*time.Second)
		return err
	})
	return c, err
}
