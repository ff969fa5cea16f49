package network

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// testNetns makes a named network namespace with one end of a veth pair
// in it as eth0 (10.77.0.2/24, fd77::2/64, default routes via the other
// end), the other end on the host, and removes both when the test ends.
func testNetns(t *testing.T) (path string, mac net.HardwareAddr) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("network namespaces need root")
	}
	name := fmt.Sprintf("cocoon-nettest-%d", os.Getpid())
	host := fmt.Sprintf("ccvh%d", os.Getpid()%100000)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "netns", "add", name)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", host).Run()
		exec.Command("ip", "netns", "del", name).Run()
	})
	run("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", name)
	run("ip", "-n", name, "link", "set", "eth0", "mtu", "1400", "up")
	run("ip", "-n", name, "addr", "add", "10.77.0.2/24", "dev", "eth0")
	run("ip", "-n", name, "-6", "addr", "add", "fd77::2/64", "dev", "eth0", "nodad")
	run("ip", "-n", name, "route", "add", "default", "via", "10.77.0.1")
	run("ip", "-n", name, "-6", "route", "add", "default", "via", "fd77::1")
	run("ip", "-n", name, "route", "add", "192.168.50.0/24", "via", "10.77.0.1", "metric", "7")
	path = "/var/run/netns/" + name
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	return path, l.Attrs().HardwareAddr
}

func TestPlumb(t *testing.T) {
	path, mac := testNetns(t)
	p, err := Plumb(path)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if len(p.Config.Interfaces) != 1 || len(p.Taps) != 1 {
		t.Fatalf("interfaces %+v, %d taps", p.Config.Interfaces, len(p.Taps))
	}
	iface := p.Config.Interfaces[0]
	want := []netip.Prefix{netip.MustParsePrefix("10.77.0.2/24"), netip.MustParsePrefix("fd77::2/64")}
	if iface.Name != "eth0" || iface.MAC.String() != mac.String() || iface.MTU != 1400 || fmt.Sprint(iface.Addresses) != fmt.Sprint(want) {
		t.Errorf("interface %+v, want eth0 %s mtu 1400 %v", iface, mac, want)
	}
	routes := map[string]Route{}
	for _, r := range p.Config.Routes {
		routes[r.Destination.String()+" via "+r.Gateway.String()] = r
	}
	for _, k := range []string{"invalid Prefix via 10.77.0.1", "invalid Prefix via fd77::1", "192.168.50.0/24 via 10.77.0.1"} {
		if r, ok := routes[k]; !ok || r.Interface != "eth0" {
			t.Errorf("no route %s on eth0 in %+v", k, p.Config.Routes)
		}
	}
	if r := routes["192.168.50.0/24 via 10.77.0.1"]; r.Metric != 7 {
		t.Errorf("metric %d, want 7", r.Metric)
	}
	if len(p.Config.Routes) != 3 {
		t.Errorf("routes %+v: the kernel's own routes are not the guest's to add", p.Config.Routes)
	}
	// The tap is there, up, with the veth's MTU, and each redirects
	// to the other.
	out, err := exec.Command("ip", "-n", strings.TrimPrefix(path, "/var/run/netns/"), "-d", "link", "show", "cctap0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "mtu 1400") || !strings.Contains(string(out), "tun type tap") {
		t.Errorf("tap: %v\n%s", err, out)
	}
	for _, dev := range []string{"eth0", "cctap0"} {
		out, err := exec.Command("tc", "-n", strings.TrimPrefix(path, "/var/run/netns/"), "filter", "show", "dev", dev, "ingress").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "mirred (Egress Redirect to device") {
			t.Errorf("no redirect on %s: %v\n%s", dev, err, out)
		}
	}

	// A second VM cannot mirror the same namespace (Docker's --network
	// container:<id> joins a running container's).
	if q, err := Plumb(path); err == nil || !strings.Contains(err.Error(), "mirrored into another VM") {
		if q != nil {
			q.Close()
		}
		t.Errorf("a second Plumb of a mirrored namespace: %v", err)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	ns := strings.TrimPrefix(path, "/var/run/netns/")
	if out, _ := exec.Command("ip", "-n", ns, "link", "show", "cctap0").CombinedOutput(); !strings.Contains(string(out), "does not exist") {
		t.Errorf("the tap outlived its last descriptor:\n%s", out)
	}
	if out, _ := exec.Command("tc", "-n", ns, "qdisc", "show", "dev", "eth0").CombinedOutput(); strings.Contains(string(out), "ingress") {
		t.Errorf("the veth keeps its ingress qdisc:\n%s", out)
	}
	if err := p.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	// The namespace and its interface are the owner's: still there.
	if out, err := exec.Command("ip", "-n", ns, "addr", "show", "eth0").CombinedOutput(); err != nil || !strings.Contains(string(out), "10.77.0.2/24") {
		t.Errorf("eth0 after Close: %v\n%s", err, out)
	}
}

// A namespace with loopback only gives no interface and no tap.
func TestPlumbLoopbackOnly(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("network namespaces need root")
	}
	name := fmt.Sprintf("cocoon-nettest-lo-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", name).Run()
	p, err := Plumb("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if len(p.Config.Interfaces) != 0 || len(p.Taps) != 0 || len(p.Config.Routes) != 0 {
		t.Errorf("%+v", p.Config)
	}
}

// A process's namespace (another container's, as Docker's --network
// container:<id> names it) is not taken over.
func TestPlumbProcessNamespace(t *testing.T) {
	path, _ := testNetns(t)
	cmd := exec.Command("ip", "netns", "exec", strings.TrimPrefix(path, "/var/run/netns/"), "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	proc := fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		a, _ := os.Readlink(proc)
		b, _ := os.Readlink("/proc/self/ns/net")
		if a != b || time.Now().After(deadline) {
			break // in the namespace (or never: Plumb fails either way)
		}
	}
	if p, err := Plumb(proc); err == nil || !strings.Contains(err.Error(), "--network container") {
		if p != nil {
			p.Close()
		}
		t.Errorf("Plumb(%s) = %v, want a refusal", proc, err)
	}
	ns := strings.TrimPrefix(path, "/var/run/netns/")
	if out, _ := exec.Command("ip", "-n", ns, "link", "show", "cctap0").CombinedOutput(); !strings.Contains(string(out), "does not exist") {
		t.Errorf("a refused Plumb made a tap:\n%s", out)
	}
}

func TestPlumbNoNamespace(t *testing.T) {
	if _, err := Plumb("/var/run/netns/cocoon-no-such-namespace"); err == nil || !strings.Contains(err.Error(), "cocoon-no-such-namespace") {
		t.Errorf("err = %v", err)
	}
}

func TestProbe(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if err := Probe(); err != nil {
		t.Fatal(err)
	}
}

// TestBindLate: a namespace with loopback only at Plumb gets a spare
// tap; an interface that appears afterwards (Docker's, between the
// task's Create and Start) is bound to it, with its routes, and a
// second one, with no spare left, is refused by name.
func TestBindLate(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("network namespaces need root")
	}
	name := fmt.Sprintf("cocoon-nettest-late-%d", os.Getpid())
	host := fmt.Sprintf("cclh%d", os.Getpid()%100000)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("ip", "netns", "add", name)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", host).Run()
		exec.Command("ip", "link", "del", host+"b").Run()
		exec.Command("ip", "netns", "del", name).Run()
	})
	p, err := Plumb("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.AddSpares(1); err != nil {
		t.Fatal(err)
	}
	if len(p.Taps) != 1 || p.Spares() != 1 || len(p.Config.Interfaces) != 0 {
		t.Fatalf("after AddSpares(1): %d taps, %d spares, %+v", len(p.Taps), p.Spares(), p.Config)
	}
	if n, err := p.BindLate(); n != 0 || err != nil {
		t.Fatalf("BindLate with nothing new = %d, %v", n, err)
	}
	// The spare's tap forwards nothing yet.
	if out := run("tc", "-n", name, "filter", "show", "dev", "cctap0", "ingress"); strings.Contains(out, "mirred") {
		t.Errorf("an unbound spare redirects:\n%s", out)
	}

	run("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", name)
	run("ip", "-n", name, "link", "set", "eth0", "mtu", "1450", "up")
	run("ip", "-n", name, "addr", "add", "10.78.0.2/24", "dev", "eth0")
	run("ip", "-n", name, "route", "add", "default", "via", "10.78.0.1")
	n, err := p.BindLate()
	if n != 1 || err != nil {
		t.Fatalf("BindLate = %d, %v", n, err)
	}
	if p.Spares() != 0 || len(p.Config.Interfaces) != 1 {
		t.Fatalf("after BindLate: %d spares, %+v", p.Spares(), p.Config)
	}
	iface := p.Config.Interfaces[0]
	if iface.Device != 0 || iface.Name != "eth0" || iface.MTU != 1450 || fmt.Sprint(iface.Addresses) != "[10.78.0.2/24]" {
		t.Errorf("bound interface %+v", iface)
	}
	if len(p.Config.Routes) != 1 || p.Config.Routes[0].Gateway.String() != "10.78.0.1" || p.Config.Routes[0].Interface != "eth0" {
		t.Errorf("routes %+v", p.Config.Routes)
	}
	if out := run("ip", "-n", name, "link", "show", "cctap0"); !strings.Contains(out, "mtu 1450") {
		t.Errorf("the bound tap has not the interface's MTU:\n%s", out)
	}
	for _, dev := range []string{"eth0", "cctap0"} {
		if out := run("tc", "-n", name, "filter", "show", "dev", dev, "ingress"); !strings.Contains(out, "mirred (Egress Redirect to device") {
			t.Errorf("no redirect on %s:\n%s", dev, out)
		}
	}
	if n, err := p.BindLate(); n != 0 || err != nil {
		t.Errorf("BindLate again = %d, %v", n, err)
	}

	run("ip", "link", "add", host+"b", "type", "veth", "peer", "name", "eth1", "netns", name)
	if n, err := p.BindLate(); n != 0 || err == nil || !strings.Contains(err.Error(), "eth1") {
		t.Errorf("a second late interface with no spare: BindLate = %d, %v", n, err)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if out := run("tc", "-n", name, "qdisc", "show", "dev", "eth0"); strings.Contains(out, "ingress") {
		t.Errorf("the late interface keeps its ingress qdisc after Close:\n%s", out)
	}
}
