package integration

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// netnsFixture is a named network namespace with one end of a veth pair
// in it as eth0, addressed and routed as CNI's bridge plugin would leave
// a container's namespace, and the other end on the host: what a
// container joins with --with-ns network:<path>.
type netnsFixture struct {
	name, path, hostIf string
	hostIP, guestIP    string
	guestIP6           string
}

// makeNetns makes the fixture for subnet 10.201.<n>.0/24 and
// fd01:<n>::/64 and removes it when the test ends.
func makeNetns(t *testing.T, n int) netnsFixture {
	t.Helper()
	f := netnsFixture{
		name: fmt.Sprintf("cocoon-it-%d-%d", os.Getpid(), n), hostIf: fmt.Sprintf("ccit%d", n),
		hostIP: fmt.Sprintf("10.201.%d.1", n), guestIP: fmt.Sprintf("10.201.%d.2", n), guestIP6: fmt.Sprintf("fd01:%d::2", n),
	}
	f.path = "/var/run/netns/" + f.name
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "netns", "add", f.name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", f.hostIf).Run()
		_ = exec.Command("ip", "netns", "del", f.name).Run()
	})
	run("ip", "link", "add", f.hostIf, "type", "veth", "peer", "name", "eth0", "netns", f.name)
	run("ip", "addr", "add", f.hostIP+"/24", "dev", f.hostIf)
	run("ip", "-6", "addr", "add", fmt.Sprintf("fd01:%d::1/64", n), "dev", f.hostIf, "nodad")
	run("ip", "link", "set", f.hostIf, "up")
	run("ip", "-n", f.name, "addr", "add", f.guestIP+"/24", "dev", "eth0")
	run("ip", "-n", f.name, "-6", "addr", "add", f.guestIP6+"/64", "dev", "eth0", "nodad")
	run("ip", "-n", f.name, "link", "set", "eth0", "mtu", "1450", "up")
	run("ip", "-n", f.name, "route", "add", "default", "via", f.hostIP)
	return f
}

// nsOut runs a command in the fixture's namespace and returns its
// output.
func (f netnsFixture) nsOut(args ...string) string {
	out, _ := exec.Command("ip", append([]string{"netns", "exec", f.name}, args...)...).CombinedOutput()
	return string(out)
}

// fetch gets a page from the guest's httpd in f's namespace (see
// hostGet) and returns its body.
func (f netnsFixture) fetch(t *testing.T, page string) string {
	t.Helper()
	return hostGet(t, "http://"+f.guestIP+":8080/"+page)
}

// TestNetworkNamespace: a container that joins a network namespace gets
// its interface in the VM (name, MAC, MTU, IPv4 and IPv6 addresses,
// default route), reaches the host's end of the veth and serves it, and
// leaves nothing of Cocoon's in the namespace, which stays its owner's.
func TestNetworkNamespace(t *testing.T) {
	for i, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			f := makeNetns(t, 10+i)
			mac := strings.TrimSpace(f.nsOut("cat", "/sys/class/net/eth0/address"))
			removeAtEnd(t, c, "net1", "net2")
			c.MustCtr("run", "-d", "--runtime", runtimeName, "--with-ns", "network:"+f.path, img, "net1",
				"sh", "-c", "mkdir -p /www && echo hello-from-the-vm > /www/index.html && exec httpd -f -p 8080 -h /www")
			c.WaitStatus(t, "net1", "RUNNING")

			got := execOut(t, c, "net1", "sh", "-c", "cat /sys/class/net/eth0/address /sys/class/net/eth0/mtu; ip addr show eth0; ip route; ip -6 addr show eth0")
			for _, want := range []string{mac, "1450", "inet " + f.guestIP + "/24", "default via " + f.hostIP, "inet6 " + f.guestIP6 + "/64"} {
				if !strings.Contains(got, want) {
					t.Errorf("the guest's eth0 lacks %q:\n%s", want, got)
				}
			}
			if out, err := c.Ctr("task", "exec", "--exec-id", "ping", "net1", "ping", "-c", "1", "-W", "10", f.hostIP); err != nil {
				t.Errorf("ping the host's end from the guest: %v\n%s", err, out)
			}
			if body := f.fetch(t, "index.html"); body != "hello-from-the-vm" {
				t.Errorf("wget from the host: %q", body)
			}
			// The namespace shows the tap and the redirects meanwhile.
			if out := f.nsOut("tc", "filter", "show", "dev", "eth0", "ingress"); !strings.Contains(out, "mirred") {
				t.Errorf("no redirect on the namespace's eth0:\n%s", out)
			}

			killAndRemove(t, c, "net1")
			c.WaitNoShim(t)
			if out := f.nsOut("ip", "link", "show"); strings.Contains(out, "cctap") {
				t.Errorf("a tap is left in the namespace:\n%s", out)
			}
			if out := f.nsOut("tc", "qdisc", "show", "dev", "eth0"); strings.Contains(out, "ingress") {
				t.Errorf("the redirect is left on the namespace's eth0:\n%s", out)
			}
			if out := f.nsOut("ip", "addr", "show", "eth0"); !strings.Contains(out, f.guestIP) {
				t.Errorf("the namespace's eth0 lost its address:\n%s", out)
			}

			// Without a namespace to join (--network none), the container
			// has loopback only.
			out, err := c.Ctr("run", "--rm", "--runtime", runtimeName, img, "net2", "ls", "/sys/class/net")
			if ifs := strings.Fields(out); err != nil || len(ifs) != 1 || ifs[0] != "lo" {
				t.Errorf("interfaces without a namespace to join: %v %q, want lo only", err, out)
			}
		})
	}
}

// TestNetworkCheckpoint: a container on a joined namespace, checkpointed
// and restored into the same namespace, serves again: the restore plumbs
// the namespace anew and the guest's interface gets its configuration
// again (containerd 2.4: the restore is the shim's own path).
func TestNetworkCheckpoint(t *testing.T) {
	c, img, _ := shimContainerd(t, "2.4")
	f := makeNetns(t, 20)
	removeAtEnd(t, c, "netck")
	c.MustCtr("run", "-d", "--runtime", runtimeName, "--with-ns", "network:"+f.path, img, "netck",
		"sh", "-c", "mkdir -p /www && echo before > /www/index.html && exec httpd -f -p 8080 -h /www")
	c.WaitStatus(t, "netck", "RUNNING")
	if body := f.fetch(t, "index.html"); body != "before" {
		t.Fatalf("before the checkpoint: %q", body)
	}
	c.MustCtr("container", "checkpoint", "--task", "netck", "checkpoint/netck:1")
	killAndRemove(t, c, "netck")
	if out := f.nsOut("ip", "link", "show"); strings.Contains(out, "cctap") {
		t.Errorf("a tap is left after the removal:\n%s", out)
	}
	c.MustCtr("container", "restore", "--live", "netck", "checkpoint/netck:1")
	c.WaitStatus(t, "netck", "RUNNING")
	if body := f.fetch(t, "index.html"); body != "before" {
		t.Errorf("after the restore: %q", body)
	}
	if got := execOut(t, c, "netck", "ip", "addr", "show", "eth0"); !strings.Contains(got, "inet "+f.guestIP+"/24") {
		t.Errorf("the restored guest's eth0:\n%s", got)
	}
	killAndRemove(t, c, "netck")
	c.WaitNoShim(t)
	if out := f.nsOut("tc", "qdisc", "show", "dev", "eth0"); strings.Contains(out, "ingress") {
		t.Errorf("the redirect is left on the namespace's eth0:\n%s", out)
	}
}
