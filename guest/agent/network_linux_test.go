package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/api"
)

// inNewNetns moves the calling goroutine, locked to its thread, into a
// new network namespace for the rest of the test. The netlink calls of
// the test and of the code under test act there.
func inNewNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Skipf("cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() {
		err := netns.Set(orig)
		ns.Close()
		orig.Close()
		// A thread left in the test's namespace ends with the
		// goroutine instead of going back to the scheduler.
		if err == nil {
			runtime.UnlockOSThread()
		} else {
			t.Errorf("restore network namespace: %v", err)
		}
	})
}

// fakeVirtioNet makes a veth pair whose first end stands for a virtio-net
// interface: sysfs says it is virtio<n> with the driver given. The peer is
// up, so the interface has a carrier once up.
func fakeVirtioNet(t *testing.T, sys, name string, n int, driver string) netlink.Link {
	t.Helper()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	peer, err := netlink.LinkByName(name + "p")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(peer); err != nil {
		t.Fatal(err)
	}
	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	fakeSysfsDevice(t, sys, name, "virtio"+strconv.Itoa(n), driver)
	writeIfindex(t, sys, name, link.Attrs().Index)
	return link
}

// writeIfindex gives the fake sysfs interface its ifindex file. The tree
// keeps the names the interfaces had when made: sysfs renames its entries
// with the interfaces, ConfigureNetwork goes by the index.
func writeIfindex(t *testing.T, sys, name string, index int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(sys, "class", "net", name, "ifindex"), []byte(strconv.Itoa(index)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeSysfsDevice makes <sys>/class/net/<name>/device a link to a
// directory named dev whose driver links to a directory named driver.
func fakeSysfsDevice(t *testing.T, sys, name, dev, driver string) {
	t.Helper()
	devDir := filepath.Join(sys, "devices", "platform", "mmio."+name, dev)
	drvDir := filepath.Join(sys, "bus", "virtio", "drivers", driver)
	netDir := filepath.Join(sys, "class", "net", name)
	for _, d := range []string{devDir, drvDir, netDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rel := func(from, to string) string {
		r, err := filepath.Rel(from, to)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if err := os.Symlink(rel(netDir, devDir), filepath.Join(netDir, "device")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(rel(devDir, drvDir), filepath.Join(devDir, "driver")); err != nil {
		t.Fatal(err)
	}
}

func TestVirtioNetDevices(t *testing.T) {
	sys := t.TempDir()
	fakeSysfsDevice(t, sys, "ten", "virtio10", virtioNetDriver)
	fakeSysfsDevice(t, sys, "nine", "virtio9", virtioNetDriver)
	fakeSysfsDevice(t, sys, "two", "virtio2", virtioNetDriver)
	fakeSysfsDevice(t, sys, "console", "virtio3", "virtio_console")
	fakeSysfsDevice(t, sys, "pci", "0000:00:03.0", virtioNetDriver)
	for i, name := range []string{"ten", "nine", "two", "console", "pci"} {
		writeIfindex(t, sys, name, 10+i)
	}
	// Unbound, and without a device at all.
	if err := os.MkdirAll(filepath.Join(sys, "devices", "virtio4"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(sys, "class", "net", "unbound"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../devices/virtio4", filepath.Join(sys, "class", "net", "unbound", "device")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(sys, "class", "net", "lo"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := virtioNetDevices(sys)
	if err != nil {
		t.Fatal(err)
	}
	want := []virtioNetDevice{{"two", 12, 2}, {"nine", 11, 9}, {"ten", 10, 10}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// A virtio-net interface without its ifindex is an error, not
	// one fewer device: the indices after it would shift.
	if err := os.Remove(filepath.Join(sys, "class", "net", "nine", "ifindex")); err != nil {
		t.Fatal(err)
	}
	if _, err := virtioNetDevices(sys); err == nil {
		t.Fatal("no ifindex: want an error")
	}
	if _, err := virtioNetDevices(filepath.Join(sys, "none")); err == nil {
		t.Fatal("no class/net: want an error")
	}
}

func TestSetIPv6Sysctl(t *testing.T) {
	proc := t.TempDir()
	// IPv6 off: nothing to set.
	if err := setIPv6Sysctl(proc, "eth0", "accept_dad", "0"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(proc, "sys", "net", "ipv6", "conf", "eth0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "accept_ra"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := setIPv6Sysctl(proc, "eth0", "accept_ra", "0"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "accept_ra")); string(b) != "0" {
		t.Fatalf("accept_ra is %q", b)
	}
	// An existing interface's missing key is not created.
	if err := setIPv6Sysctl(proc, "eth0", "accept_dad", "0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "accept_dad")); !os.IsNotExist(err) {
		t.Fatalf("accept_dad created: %v", err)
	}
}

func TestKeepAddr(t *testing.T) {
	for s, want := range map[string]bool{
		"fe80::1/64":     true,
		"fe80::abcd/10":  true,
		"fd00::1/64":     false,
		"2001:db8::1/64": false,
		"10.0.0.1/24":    false,
		"169.254.1.1/16": false,
	} {
		ip, ipnet, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		ipnet.IP = ip
		if got := keepAddr(netlink.Addr{IPNet: ipnet}); got != want {
			t.Errorf("%s: keep %v, want %v", s, got, want)
		}
	}
}

// validNetworkRequest is a request for two interfaces and their routes.
func validNetworkRequest() *api.ConfigureNetworkRequest {
	return &api.ConfigureNetworkRequest{
		Interfaces: []*api.NetworkInterface{
			{Index: 0, Name: "ceth0", Mac: "02:00:00:00:00:01", Mtu: 1400, Addresses: []string{"10.4.0.5/24", "fd00::5/64"}},
			{Index: 1, Name: "ceth1", Mac: "02:00:00:00:00:02", Addresses: []string{"10.5.0.5/24", "fd01::5/64"}},
		},
		Routes: []*api.NetworkRoute{
			{Gateway: "10.4.0.1", Interface: "ceth0"},
			{Gateway: "fe80::1", Interface: "ceth0"},
			// Its gateway is reachable through the link route that
			// comes after it.
			{Destination: "192.168.50.0/24", Gateway: "172.16.0.1", Interface: "ceth1", Source: "10.5.0.5", Metric: 100},
			{Destination: "172.16.0.0/16", Interface: "ceth1"},
			{Destination: "fd02::/64", Gateway: "fd01::1", Interface: "ceth1", Metric: 50},
		},
	}
}

type invalidNetworkCase struct {
	name   string
	want   string // in the error
	change func(r *api.ConfigureNetworkRequest)
}

func invalidNetworkRequests() []invalidNetworkCase {
	ifc := func(r *api.ConfigureNetworkRequest) *api.NetworkInterface { return r.Interfaces[0] }
	route := func(r *api.ConfigureNetworkRequest) *api.NetworkRoute { return r.Routes[0] }
	return []invalidNetworkCase{
		{"too many interfaces", "17 interfaces", func(r *api.ConfigureNetworkRequest) {
			for i := 2; i < 17; i++ {
				r.Interfaces = append(r.Interfaces, &api.NetworkInterface{Index: uint32(i), Name: "x" + strconv.Itoa(i), Mac: "02:00:00:00:01:00"})
			}
		}},
		{"index too large", "index 16", func(r *api.ConfigureNetworkRequest) { ifc(r).Index = 16 }},
		{"index twice", "index 0 given twice", func(r *api.ConfigureNetworkRequest) { r.Interfaces[1].Index = 0 }},
		{"name twice", `name "ceth0" given twice`, func(r *api.ConfigureNetworkRequest) { r.Interfaces[1].Name = "ceth0" }},
		{"empty name", `name ""`, func(r *api.ConfigureNetworkRequest) { ifc(r).Name = "" }},
		{"long name", `name "abcdefghijklmnop"`, func(r *api.ConfigureNetworkRequest) { ifc(r).Name = "abcdefghijklmnop" }},
		{"name with slash", `name "a/b"`, func(r *api.ConfigureNetworkRequest) { ifc(r).Name = "a/b" }},
		{"name with space", `name "a b"`, func(r *api.ConfigureNetworkRequest) { ifc(r).Name = "a b" }},
		{"name with colon", `name "eth0:1"`, func(r *api.ConfigureNetworkRequest) { ifc(r).Name = "eth0:1" }},
		{"name lo", `name "lo"`, func(r *api.ConfigureNetworkRequest) { ifc(r).Name = "lo" }},
		{"name dot", `name "."`, func(r *api.ConfigureNetworkRequest) { ifc(r).Name = "." }},
		{"name dotdot", `name ".."`, func(r *api.ConfigureNetworkRequest) { ifc(r).Name = ".." }},
		{"bad mac", `mac "02:00:00:00:00"`, func(r *api.ConfigureNetworkRequest) { ifc(r).Mac = "02:00:00:00:00" }},
		{"empty mac", `mac ""`, func(r *api.ConfigureNetworkRequest) { ifc(r).Mac = "" }},
		{"long mac", "not a 6-byte", func(r *api.ConfigureNetworkRequest) { ifc(r).Mac = "02:00:00:00:00:00:00:01" }},
		{"multicast mac", "multicast", func(r *api.ConfigureNetworkRequest) { ifc(r).Mac = "01:00:5e:00:00:01" }},
		{"broadcast mac", "multicast", func(r *api.ConfigureNetworkRequest) { ifc(r).Mac = "ff:ff:ff:ff:ff:ff" }},
		{"zero mac", "all zero", func(r *api.ConfigureNetworkRequest) { ifc(r).Mac = "00:00:00:00:00:00" }},
		{"small mtu", "mtu 67", func(r *api.ConfigureNetworkRequest) { ifc(r).Mtu = 67 }},
		{"large mtu", "mtu 65536", func(r *api.ConfigureNetworkRequest) { ifc(r).Mtu = 65536 }},
		{"bad address", `address "10.4.0.5"`, func(r *api.ConfigureNetworkRequest) { ifc(r).Addresses = append(ifc(r).Addresses, "10.4.0.5") }},
		{"garbage address", `address "x/24"`, func(r *api.ConfigureNetworkRequest) { ifc(r).Addresses = append(ifc(r).Addresses, "x/24") }},
		{"address prefix too long", `address "10.4.0.9/33"`, func(r *api.ConfigureNetworkRequest) { ifc(r).Addresses = append(ifc(r).Addresses, "10.4.0.9/33") }},
		{"address twice", "given twice", func(r *api.ConfigureNetworkRequest) { ifc(r).Addresses = append(ifc(r).Addresses, "10.4.0.5/16") }},
		{"mapped address", "IPv4-mapped", func(r *api.ConfigureNetworkRequest) {
			ifc(r).Addresses = append(ifc(r).Addresses, "::ffff:10.4.0.9/120")
		}},
		{"too many addresses", "33 addresses", func(r *api.ConfigureNetworkRequest) {
			ifc(r).Addresses = nil
			for i := range 33 {
				ifc(r).Addresses = append(ifc(r).Addresses, "10.4.0."+strconv.Itoa(i+1)+"/24")
			}
		}},
		{"too many routes", "65 routes", func(r *api.ConfigureNetworkRequest) {
			for i := len(r.Routes); i < 65; i++ {
				r.Routes = append(r.Routes, &api.NetworkRoute{Destination: "10.99." + strconv.Itoa(i) + ".0/24", Interface: "ceth0"})
			}
		}},
		{"route bad destination", `destination "10.8.0.0"`, func(r *api.ConfigureNetworkRequest) { route(r).Destination = "10.8.0.0" }},
		{"route destination host bits", "host bits", func(r *api.ConfigureNetworkRequest) { route(r).Destination = "10.8.0.1/16" }},
		{"route bad gateway", `gateway "10.4.0.1/24"`, func(r *api.ConfigureNetworkRequest) { route(r).Gateway = "10.4.0.1/24" }},
		{"route gateway zone", `gateway "fe80::1%eth0"`, func(r *api.ConfigureNetworkRequest) { r.Routes[1].Gateway = "fe80::1%eth0" }},
		{"route unknown interface", `interface "eth9"`, func(r *api.ConfigureNetworkRequest) { route(r).Interface = "eth9" }},
		{"route no interface", `interface ""`, func(r *api.ConfigureNetworkRequest) { route(r).Interface = "" }},
		{"route bad source", `source "10.4.0.5/24"`, func(r *api.ConfigureNetworkRequest) { route(r).Source = "10.4.0.5/24" }},
		{"route source family", "another family", func(r *api.ConfigureNetworkRequest) { route(r).Source = "fd00::5" }},
		{"route neither", "neither destination nor gateway", func(r *api.ConfigureNetworkRequest) { route(r).Gateway = "" }},
		{"route families", "different families", func(r *api.ConfigureNetworkRequest) { route(r).Destination = "fd03::/64" }},
		{"route families v6 gateway", "different families", func(r *api.ConfigureNetworkRequest) { r.Routes[1].Destination = "10.8.0.0/16" }},
	}
}

func TestValidateNetwork(t *testing.T) {
	if _, _, err := validateNetwork(validNetworkRequest()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := validateNetwork(&api.ConfigureNetworkRequest{}); err != nil {
		t.Fatalf("empty request: %v", err)
	}
	for _, tc := range invalidNetworkRequests() {
		req := validNetworkRequest()
		tc.change(req)
		_, _, err := validateNetwork(req)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want invalid argument with %q, got %v", tc.name, tc.want, err)
		}
	}
}

// linkState is what an invalid request must leave as it was.
type linkState struct {
	name  string
	mac   string
	mtu   int
	up    bool
	addrs []string
}

func stateOf(t *testing.T, index int) linkState {
	t.Helper()
	link, err := netlink.LinkByIndex(index)
	if err != nil {
		t.Fatal(err)
	}
	a := link.Attrs()
	return linkState{name: a.Name, mac: a.HardwareAddr.String(), mtu: a.MTU, up: a.Flags&net.FlagUp != 0, addrs: addrsOf(t, link)}
}

// addrsOf lists a link's addresses other than the IPv6 link-local ones.
func addrsOf(t *testing.T, link netlink.Link) []string {
	t.Helper()
	list, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range list {
		if !keepAddr(a) {
			out = append(out, a.IPNet.String())
		}
	}
	slices.Sort(out)
	return out
}

// hasRoute reports whether the main table has a route to dst (as
// RouteList shows it: 0.0.0.0/0 for the IPv4 default) via gw ("" for
// none) on the link with the index given, and returns it.
func hasRoute(t *testing.T, dst, gw string, linkIndex int) (netlink.Route, bool) {
	t.Helper()
	routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.String() != dst || r.LinkIndex != linkIndex {
			continue
		}
		if (gw == "" && r.Gw == nil) || (gw != "" && r.Gw.Equal(net.ParseIP(gw))) {
			return r, true
		}
	}
	return netlink.Route{}, false
}

func readSysctl(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestConfigureNetwork(t *testing.T) {
	inNewNetns(t)
	ctx := context.Background()
	sys := t.TempDir()
	// Sysfs order, not the order of creation or of names, is what
	// counts: virtio9 is index 0 and virtio10 index 1.
	second := fakeVirtioNet(t, sys, "vn-a", 10, virtioNetDriver)
	first := fakeVirtioNet(t, sys, "vn-b", 9, virtioNetDriver)
	other := fakeVirtioNet(t, sys, "vn-c", 3, "virtio_blk")
	old := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("10.9.9.9").To4(), Mask: net.CIDRMask(24, 32)}}
	if err := netlink.AddrAdd(first, old); err != nil {
		t.Fatal(err)
	}
	// The sysctls are the real ones: the test's namespace has them
	// when IPv6 is on.
	ipv6 := true
	if _, err := os.Stat("/proc/sys/net/ipv6/conf/vn-b"); err != nil {
		t.Logf("no IPv6 sysctls of vn-b (%v): skipping their checks", err)
		ipv6 = false
	}

	s := newService(t, Config{})
	s.net.sysRoot = sys

	idx0, idx1 := first.Attrs().Index, second.Attrs().Index
	before0, before1 := stateOf(t, idx0), stateOf(t, idx1)
	unchanged := func(what string) {
		t.Helper()
		if got := stateOf(t, idx0); !equalState(got, before0) {
			t.Fatalf("%s changed index 0: %+v, was %+v", what, got, before0)
		}
		if got := stateOf(t, idx1); !equalState(got, before1) {
			t.Fatalf("%s changed index 1: %+v, was %+v", what, got, before1)
		}
	}

	for _, tc := range invalidNetworkRequests() {
		req := validNetworkRequest()
		tc.change(req)
		_, err := s.ConfigureNetwork(ctx, req)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want invalid argument with %q, got %v", tc.name, tc.want, err)
		}
	}
	unchanged("invalid requests")

	req := validNetworkRequest()
	req.Interfaces[1].Index = 2 // vn-c is no virtio-net device
	_, err := s.ConfigureNetwork(ctx, req)
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "interface 2") || !strings.Contains(err.Error(), "has 2") {
		t.Fatalf("index without a device: want not found naming it and the count, got %v", err)
	}
	unchanged("index without a device")

	req = validNetworkRequest()
	req.Interfaces[1].Name = other.Attrs().Name
	req.Routes = nil
	_, err = s.ConfigureNetwork(ctx, req)
	if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "vn-c") {
		t.Fatalf("name of another link: want already exists, got %v", err)
	}
	unchanged("name of another link")

	// The first configuration.
	if _, err := s.ConfigureNetwork(ctx, validNetworkRequest()); err != nil {
		t.Fatal(err)
	}
	want0 := linkState{name: "ceth0", mac: "02:00:00:00:00:01", mtu: 1400, up: true, addrs: []string{"10.4.0.5/24", "fd00::5/64"}}
	want1 := linkState{name: "ceth1", mac: "02:00:00:00:00:02", mtu: before1.mtu, up: true, addrs: []string{"10.5.0.5/24", "fd01::5/64"}}
	if got := stateOf(t, idx0); !equalState(got, want0) {
		t.Errorf("index 0: %+v, want %+v", got, want0)
	}
	if got := stateOf(t, idx1); !equalState(got, want1) {
		t.Errorf("index 1: %+v, want %+v", got, want1)
	}
	if got := stateOf(t, other.Attrs().Index); got.name != "vn-c" || got.up {
		t.Errorf("the other device was touched: %+v", got)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if lo.Attrs().Flags&net.FlagUp == 0 {
		t.Error("lo is down")
	}
	for _, addr := range []string{"10.4.0.5/24", "fd00::5/64"} {
		list, _ := netlink.AddrList(first, netlink.FAMILY_ALL)
		for _, a := range list {
			if a.IPNet.String() == addr && a.Flags&unix.IFA_F_TENTATIVE != 0 {
				t.Errorf("%s is tentative", addr)
			}
		}
	}
	routes1 := []struct{ dst, gw string }{
		{"0.0.0.0/0", "10.4.0.1"},
		{"::/0", "fe80::1"},
	}
	for _, r := range routes1 {
		if _, ok := hasRoute(t, r.dst, r.gw, idx0); !ok {
			t.Errorf("no route %s via %s dev ceth0", r.dst, r.gw)
		}
	}
	if r, ok := hasRoute(t, "192.168.50.0/24", "172.16.0.1", idx1); !ok {
		t.Error("no route 192.168.50.0/24 via 172.16.0.1 dev ceth1")
	} else if r.Priority != 100 || !r.Src.Equal(net.ParseIP("10.5.0.5")) {
		t.Errorf("192.168.50.0/24: metric %d src %v", r.Priority, r.Src)
	}
	if r, ok := hasRoute(t, "172.16.0.0/16", "", idx1); !ok {
		t.Error("no route 172.16.0.0/16 dev ceth1")
	} else if r.Scope != netlink.SCOPE_LINK {
		t.Errorf("172.16.0.0/16: scope %v", r.Scope)
	}
	if r, ok := hasRoute(t, "fd02::/64", "fd01::1", idx1); !ok {
		t.Error("no route fd02::/64 via fd01::1 dev ceth1")
	} else if r.Priority != 50 {
		t.Errorf("fd02::/64: metric %d", r.Priority)
	}
	if ipv6 {
		for _, name := range []string{"ceth0", "ceth1"} {
			for _, key := range []string{"accept_dad", "accept_ra"} {
				if v := readSysctl(t, filepath.Join("/proc/sys/net/ipv6/conf", name, key)); v != "0" {
					t.Errorf("%s %s is %s", name, key, v)
				}
			}
		}
	}

	// A second configuration replaces the addresses of the interface it
	// names and every route of the first.
	req = &api.ConfigureNetworkRequest{
		Interfaces: []*api.NetworkInterface{
			{Index: 0, Name: "ceth0", Mac: "02:00:00:00:00:03", Mtu: 1500, Addresses: []string{"10.4.0.6/24"}},
		},
		Routes: []*api.NetworkRoute{
			{Destination: "10.77.0.0/16", Gateway: "10.4.0.1", Interface: "ceth0"},
		},
	}
	if _, err := s.ConfigureNetwork(ctx, req); err != nil {
		t.Fatal(err)
	}
	want0 = linkState{name: "ceth0", mac: "02:00:00:00:00:03", mtu: 1500, up: true, addrs: []string{"10.4.0.6/24"}}
	if got := stateOf(t, idx0); !equalState(got, want0) {
		t.Errorf("index 0 after the second call: %+v, want %+v", got, want0)
	}
	if got := stateOf(t, idx1); !equalState(got, want1) {
		t.Errorf("index 1, not named, changed: %+v, want %+v", got, want1)
	}
	if _, ok := hasRoute(t, "10.77.0.0/16", "10.4.0.1", idx0); !ok {
		t.Error("no route 10.77.0.0/16 via 10.4.0.1 dev ceth0")
	}
	gone := []struct {
		dst, gw string
		link    int
	}{
		{"0.0.0.0/0", "10.4.0.1", idx0},
		{"::/0", "fe80::1", idx0},
		{"192.168.50.0/24", "172.16.0.1", idx1},
		{"172.16.0.0/16", "", idx1},
		{"fd02::/64", "fd01::1", idx1},
	}
	for _, r := range gone {
		if _, ok := hasRoute(t, r.dst, r.gw, r.link); ok {
			t.Errorf("route %s via %q of the first call is left", r.dst, r.gw)
		}
	}
	if len(s.net.routes) != 1 {
		t.Errorf("remembers %d routes, want 1", len(s.net.routes))
	}

	// Names swap.
	req = validNetworkRequest()
	req.Interfaces[0].Name, req.Interfaces[1].Name = "ceth1", "ceth0"
	req.Routes = nil
	if _, err := s.ConfigureNetwork(ctx, req); err != nil {
		t.Fatal(err)
	}
	if n0, n1 := stateOf(t, idx0).name, stateOf(t, idx1).name; n0 != "ceth1" || n1 != "ceth0" {
		t.Errorf("after the swap: index 0 is %s, index 1 %s", n0, n1)
	}
	if len(s.net.routes) != 0 {
		t.Errorf("remembers %d routes, want none", len(s.net.routes))
	}
}

func equalState(a, b linkState) bool {
	return a.name == b.name && a.mac == b.mac && a.mtu == b.mtu && a.up == b.up && slices.Equal(a.addrs, b.addrs)
}
