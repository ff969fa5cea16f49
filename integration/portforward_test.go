package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// TestPortForward runs `crictl port-forward` to a Cocoon pod: containerd's
// CRI dials the port on the loopback of the pod's network namespace on
// the host, and the shim's forwarder there takes the connection into the
// guest, where a busybox nc answers on 8080. A port nothing listens on in
// the guest gives a connection closed without a byte. The forwarder's
// rule is in the pod's namespace while the pod runs; after rmp nothing of
// the pod is left (the namespace, and its rules with it, are gone; the
// shim, and its listener with it, have exited).
func TestPortForward(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, _ := criContainerd(t, v)
			x := harness.NewCrictl(t, c)
			img := harness.ImportBusyboxCRI(t, c)

			pod := x.PodConfig("pf")
			podID := x.RunPod(t, pod, harness.CocoonRuntimeHandler)
			server := x.CreateContainer(t, podID, x.ContainerConfig("server", img, "nc", "-ll", "-p", "8080", "-e", "echo", "hello"), pod)
			x.Start(t, server)

			netns := podNetNS(t, x.InspectPod(t, podID))
			if rules := natOutput(t, netns); !strings.Contains(rules, "cocoon port-forward") {
				t.Errorf("the pod's namespace has no forwarding rule:\n%s", rules)
			}

			port, closed := freeTCPPort(t), freeTCPPort(t)
			stop := portForward(t, x, podID, fmt.Sprintf("%d:8080", port), fmt.Sprintf("%d:9999", closed))
			// Two connections: the forwarder serves more than one.
			for i := range 2 {
				if got := readLine(t, port, 60*time.Second); got != "hello" {
					t.Fatalf("connection %d through port-forward: %q, want hello", i, got)
				}
			}
			if got, err := readAll(closed); err != nil || got != "" {
				t.Errorf("port-forward to a port nothing listens on: %q, %v; want a connection closed without a byte", got, err)
			}
			stop()

			x.Stop(t, server, 0)
			x.Remove(t, server)
			x.StopPod(t, podID)
			x.RemovePod(t, podID)
			if _, err := os.Stat(netns); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the pod's namespace file after rmp: %v", err)
			}
			if left := c.WaitCRIClean(15 * time.Second); left != "" {
				t.Errorf("left after the pod was removed:\n%s", left)
			}
		})
	}
}

// podNetNS is the path of a pod's network namespace, from the runtime
// spec that inspectp shows.
func podNetNS(t *testing.T, p harness.PodInspect) string {
	t.Helper()
	spec, _ := p.Info["runtimeSpec"].(map[string]any)
	linux, _ := spec["linux"].(map[string]any)
	nss, _ := linux["namespaces"].([]any)
	for _, n := range nss {
		ns, _ := n.(map[string]any)
		if ns["type"] == "network" {
			if path, _ := ns["path"].(string); path != "" {
				return path
			}
		}
	}
	t.Fatalf("no network namespace in the pod's spec: %v", linux)
	return ""
}

// natOutput is the nat table's OUTPUT chain in the namespace at netns.
func natOutput(t *testing.T, netns string) string {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+netns, "iptables", "-w", "5", "-t", "nat", "-S", "OUTPUT").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables in %s: %v: %s", netns, err, out)
	}
	return string(out)
}

// freeTCPPort is a port of 127.0.0.1 that nothing listened on a moment
// ago.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// portForward runs `crictl port-forward podID mappings...` in the
// background until the returned func ends it (the test's end does too),
// once crictl listens on the first mapping's local port.
func portForward(t *testing.T, x *harness.Crictl, podID string, mappings ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := x.Command(ctx, append([]string{"port-forward", podID}, mappings...)...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop = func() {
		cancel()
		<-exited
	}
	t.Cleanup(stop)
	local := strings.SplitN(mappings[0], ":", 2)[0]
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp4", "127.0.0.1:"+local, time.Second); err == nil {
			// A connection that crictl forwards: it is read (and so
			// closed) by the caller's first dial instead.
			c.Close()
			break
		}
		select {
		case <-exited:
			t.Fatalf("crictl port-forward exited: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			t.Fatalf("crictl port-forward does not listen on %s: %s", local, out.String())
		}
	}
	return stop
}

// readLine connects to 127.0.0.1:port until a connection gives a line
// (the server in the guest may not listen yet: CRI then closes the
// connection without a byte) and returns it, without its new line.
func readLine(t *testing.T, port int, within time.Duration) string {
	t.Helper()
	var last string
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		got, err := readAll(port)
		if err == nil && got != "" {
			return strings.TrimSuffix(strings.SplitN(got, "\n", 2)[0], "\r")
		}
		last = fmt.Sprintf("%q, %v", got, err)
	}
	t.Fatalf("no line from 127.0.0.1:%d within %v (last: %s)", port, within, last)
	return ""
}

// readAll reads a connection to 127.0.0.1:port to its end, 30 s at most.
func readAll(port int) (string, error) {
	c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	b, err := io.ReadAll(bufio.NewReader(c))
	return string(b), err
}
