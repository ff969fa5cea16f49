package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/api"
)

// Bounds on a ConfigureNetworkRequest.
const (
	maxNetInterfaces = 16
	maxNetAddresses  = 32
	maxNetRoutes     = 64
	minMTU, maxMTU   = 68, 65535
)

const (
	virtioNetDriver = "virtio_net"
	defaultSysRoot  = "/sys"
	defaultProcRoot = "/proc"
	// dumpAttempts bounds the retries of an interrupted netlink dump.
	dumpAttempts = 5
	// renameAsideTemplate is the name of an interface moved out of the
	// way of another's rename: the kernel replaces %d with a free
	// number, and no request can ask for a name with ~.
	renameAsideTemplate = "cocoon~%d"
)

// netState is what ConfigureNetwork keeps between calls. The netlink
// calls act on the network namespace of the calling thread: the agent's
// own, and the test's in the tests.
type netState struct {
	// sysRoot and procRoot are where sysfs and procfs are mounted; ""
	// means /sys and /proc. Tests point them at fake trees.
	sysRoot  string
	procRoot string

	// mu makes one ConfigureNetwork run at a time and guards routes.
	mu sync.Mutex
	// routes are the routes the calls so far added and did not take
	// back: the next call deletes them first.
	routes []netlink.Route
}

// netInterface is a validated api.NetworkInterface.
type netInterface struct {
	index int
	name  string
	mac   net.HardwareAddr
	mtu   int
	addrs []netip.Prefix
}

// netRoute is a validated api.NetworkRoute.
type netRoute struct {
	dst    netip.Prefix // invalid for the default route
	gw     netip.Addr   // invalid for a route on the link
	src    netip.Addr   // invalid for none
	iface  string
	metric uint32
}

func (r netRoute) String() string {
	var b strings.Builder
	if r.dst.IsValid() {
		b.WriteString(r.dst.String())
	} else {
		b.WriteString("default")
	}
	if r.gw.IsValid() {
		b.WriteString(" via " + r.gw.String())
	}
	b.WriteString(" dev " + r.iface)
	if r.src.IsValid() {
		b.WriteString(" src " + r.src.String())
	}
	if r.metric != 0 {
		b.WriteString(" metric " + strconv.FormatUint(uint64(r.metric), 10))
	}
	return b.String()
}

// is6 is whether the route is an IPv6 one.
func (r netRoute) is6() bool {
	if r.dst.IsValid() {
		return r.dst.Addr().Is6()
	}
	return r.gw.Is6()
}

// ConfigureNetwork gives the guest's virtio-net interfaces the names,
// MACs, MTUs and addresses the host asks for, brings them and loopback up,
// and replaces the routes an earlier call added with the request's.
func (s *Service) ConfigureNetwork(ctx context.Context, req *api.ConfigureNetworkRequest) (*api.Empty, error) {
	if err := s.net.configure(ctx, req); err != nil {
		return nil, err
	}
	return &api.Empty{}, nil
}

func (n *netState) configure(ctx context.Context, req *api.ConfigureNetworkRequest) error {
	ifaces, routes, err := validateNetwork(req)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()

	sysRoot, procRoot := n.sysRoot, n.procRoot
	if sysRoot == "" {
		sysRoot = defaultSysRoot
	}
	if procRoot == "" {
		procRoot = defaultProcRoot
	}

	// Find every link and check every rename before changing anything.
	devs, err := virtioNetDevices(sysRoot)
	if err != nil {
		return err
	}
	links := make([]netlink.Link, len(ifaces))
	ours := make(map[int]bool, len(ifaces))
	for i, ifc := range ifaces {
		if ifc.index >= len(devs) {
			return fmt.Errorf("interface %d (%s): no such virtio-net device, the guest has %d: %w",
				ifc.index, ifc.name, len(devs), errdefs.ErrNotFound)
		}
		dev := devs[ifc.index]
		link, err := netlink.LinkByIndex(dev.ifindex)
		if err != nil {
			return fmt.Errorf("interface %d (%s): find link %s (%d): %w", ifc.index, ifc.name, dev.name, dev.ifindex, err)
		}
		links[i] = link
		ours[link.Attrs().Index] = true
	}
	wanted := make(map[string]int, len(ifaces))
	for i, ifc := range ifaces {
		wanted[ifc.name] = i
		if links[i].Attrs().Name == ifc.name {
			continue
		}
		other, err := netlink.LinkByName(ifc.name)
		switch {
		case err == nil && !ours[other.Attrs().Index]:
			return fmt.Errorf("%s: rename from %s: the name is taken by link %d: %w",
				ifc.name, links[i].Attrs().Name, other.Attrs().Index, errdefs.ErrAlreadyExists)
		case err != nil && !errors.As(err, &netlink.LinkNotFoundError{}):
			return fmt.Errorf("%s: look up the name: %w", ifc.name, err)
		}
	}
	// A link holding the name another one of the request wants (the
	// names swap) moves aside first, to a name the kernel picks and no
	// request can want.
	for i, link := range links {
		if j, ok := wanted[link.Attrs().Name]; ok && j != i {
			if err := netlink.LinkSetDown(link); err != nil {
				return fmt.Errorf("%s: set down: %w", ifaces[i].name, err)
			}
			if err := netlink.LinkSetName(link, renameAsideTemplate); err != nil {
				return fmt.Errorf("%s: rename %s aside: %w", ifaces[i].name, link.Attrs().Name, err)
			}
		}
	}

	for i, ifc := range ifaces {
		if err := configureLink(links[i], ifc, procRoot); err != nil {
			return err
		}
		log.G(ctx).WithFields(log.Fields{
			"interface": ifc.name,
			"index":     ifc.index,
			"mac":       ifc.mac.String(),
			"mtu":       ifc.mtu,
			"addresses": len(ifc.addrs),
		}).Info("network interface configured")
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: find link: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo: set up: %w", err)
	}

	if err := n.replaceRoutes(routes, links, ifaces); err != nil {
		return err
	}
	log.G(ctx).WithFields(log.Fields{
		"interfaces": len(ifaces),
		"routes":     len(routes),
	}).Info("network configured")
	return nil
}

// configureLink gives link the identity and addresses of ifc and brings
// it up.
func configureLink(link netlink.Link, ifc netInterface, procRoot string) error {
	if err := netlink.LinkSetDown(link); err != nil {
		return fmt.Errorf("%s: set down: %w", ifc.name, err)
	}
	if old := link.Attrs().Name; old != ifc.name {
		if err := netlink.LinkSetName(link, ifc.name); err != nil {
			return fmt.Errorf("%s: rename from %s: %w", ifc.name, old, err)
		}
	}
	if err := netlink.LinkSetHardwareAddr(link, ifc.mac); err != nil {
		return fmt.Errorf("%s: set mac %s: %w", ifc.name, ifc.mac, err)
	}
	if ifc.mtu != 0 {
		if err := netlink.LinkSetMTU(link, ifc.mtu); err != nil {
			return fmt.Errorf("%s: set mtu %d: %w", ifc.name, ifc.mtu, err)
		}
	}
	// As the container's interface on the host would: the host already
	// made sure its addresses are unique, and the routes come from it.
	for _, key := range []string{"accept_dad", "accept_ra"} {
		if err := setIPv6Sysctl(procRoot, ifc.name, key, "0"); err != nil {
			return fmt.Errorf("%s: sysctl net.ipv6.conf.%s.%s: %w", ifc.name, ifc.name, key, err)
		}
	}
	addrs, err := dumpRetry(func() ([]netlink.Addr, error) { return netlink.AddrList(link, netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("%s: list addresses: %w", ifc.name, err)
	}
	for _, a := range addrs {
		if keepAddr(a) {
			continue
		}
		// Deleting a primary IPv4 address may take its secondaries
		// with it.
		if err := netlink.AddrDel(link, &netlink.Addr{IPNet: a.IPNet, Peer: a.Peer}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("%s: delete address %s: %w", ifc.name, a.IPNet, err)
		}
	}
	for _, p := range ifc.addrs {
		a := &netlink.Addr{IPNet: prefixIPNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrReplace(link, a); err != nil {
			return fmt.Errorf("%s: add address %s: %w", ifc.name, p, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s: set up: %w", ifc.name, err)
	}
	return nil
}

// keepAddr is whether a flush of an interface's addresses leaves a: the
// IPv6 link-local ones, which the kernel made.
func keepAddr(a netlink.Addr) bool {
	return a.IPNet != nil && a.IP.To4() == nil && a.IP.IsLinkLocalUnicast()
}

// replaceRoutes deletes the routes an earlier call added, then adds
// routes. Routes on a link go first: a gateway may be reachable only
// through one of them (default via 169.254.1.1 after 169.254.1.1/32 on
// the link).
func (n *netState) replaceRoutes(routes []netRoute, links []netlink.Link, ifaces []netInterface) error {
	for len(n.routes) > 0 {
		r := n.routes[0]
		// Taking a link down takes its routes with it.
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("delete route %s of an earlier configuration: %w", r, err)
		}
		n.routes = n.routes[1:]
	}
	n.routes = nil
	linkIndex := make(map[string]int, len(ifaces))
	for i, ifc := range ifaces {
		linkIndex[ifc.name] = links[i].Attrs().Index
	}
	ordered := slices.Clone(routes)
	slices.SortStableFunc(ordered, func(a, b netRoute) int {
		switch {
		case !a.gw.IsValid() && b.gw.IsValid():
			return -1
		case a.gw.IsValid() && !b.gw.IsValid():
			return 1
		}
		return 0
	})
	for _, r := range ordered {
		nr := netlink.Route{
			LinkIndex: linkIndex[r.iface],
			Table:     unix.RT_TABLE_MAIN,
			Priority:  int(r.metric),
			Family:    netlink.FAMILY_V4,
		}
		if r.is6() {
			nr.Family = netlink.FAMILY_V6
		}
		if r.dst.IsValid() {
			nr.Dst = prefixIPNet(r.dst)
		}
		if r.gw.IsValid() {
			nr.Gw = net.IP(r.gw.AsSlice())
		} else {
			nr.Scope = netlink.SCOPE_LINK
		}
		if r.src.IsValid() {
			nr.Src = net.IP(r.src.AsSlice())
		}
		if err := netlink.RouteReplace(&nr); err != nil {
			return fmt.Errorf("%s: add route %s: %w", r.iface, r, err)
		}
		n.routes = append(n.routes, nr)
	}
	return nil
}

// virtioNetDevice is one of the guest's virtio-net interfaces.
type virtioNetDevice struct {
	name    string // when listed
	ifindex int
	virtio  uint64 // the N of virtioN
}

// virtioNetDevices lists the guest's virtio-net interfaces in the order
// of their virtio index, which is the order of the devices on the VM's
// command line. An interface's device is virtioN
// (<sysRoot>/class/net/<name>/device), bound to the virtio_net driver.
func virtioNetDevices(sysRoot string) ([]virtioNetDevice, error) {
	dir := filepath.Join(sysRoot, "class", "net")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list network interfaces: %w", err)
	}
	var devs []virtioNetDevice
	for _, e := range entries {
		device := filepath.Join(dir, e.Name(), "device")
		target, err := filepath.EvalSymlinks(device)
		if err != nil {
			continue // lo, or a virtual interface
		}
		num, ok := strings.CutPrefix(filepath.Base(target), "virtio")
		if !ok || num == "" || strings.Trim(num, "0123456789") != "" {
			continue
		}
		n, err := strconv.ParseUint(num, 10, 32)
		if err != nil {
			continue
		}
		driver, err := filepath.EvalSymlinks(filepath.Join(device, "driver"))
		if err != nil || filepath.Base(driver) != virtioNetDriver {
			continue
		}
		// The index, unlike the name, stays what it is while the
		// interfaces are renamed.
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "ifindex"))
		if err != nil {
			return nil, fmt.Errorf("interface %s: %w", e.Name(), err)
		}
		ifindex, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || ifindex <= 0 {
			return nil, fmt.Errorf("interface %s: ifindex %q", e.Name(), b)
		}
		devs = append(devs, virtioNetDevice{name: e.Name(), ifindex: ifindex, virtio: n})
	}
	slices.SortFunc(devs, func(a, b virtioNetDevice) int {
		if a.virtio != b.virtio {
			return compareUint(a.virtio, b.virtio)
		}
		return strings.Compare(a.name, b.name)
	})
	return devs, nil
}

func compareUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// setIPv6Sysctl writes value to net.ipv6.conf.<ifname>.<key>. Without
// IPv6 in the kernel, or on the interface, there is nothing to set.
func setIPv6Sysctl(procRoot, ifname, key, value string) error {
	f, err := os.OpenFile(filepath.Join(procRoot, "sys", "net", "ipv6", "conf", ifname, key), os.O_WRONLY|os.O_TRUNC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// dumpRetry runs a netlink dump again when the kernel says it was
// interrupted by a change, which leaves its result incomplete.
func dumpRetry[T any](dump func() ([]T, error)) ([]T, error) {
	var (
		res []T
		err error
	)
	for range dumpAttempts {
		res, err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return res, err
		}
	}
	return nil, err
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// invalidNet is a validation error of a ConfigureNetworkRequest.
func invalidNet(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// validateNetwork checks the whole request before anything changes.
func validateNetwork(req *api.ConfigureNetworkRequest) ([]netInterface, []netRoute, error) {
	if n := len(req.GetInterfaces()); n > maxNetInterfaces {
		return nil, nil, invalidNet("%d interfaces, more than %d", n, maxNetInterfaces)
	}
	if n := len(req.GetRoutes()); n > maxNetRoutes {
		return nil, nil, invalidNet("%d routes, more than %d", n, maxNetRoutes)
	}
	ifaces := make([]netInterface, 0, len(req.GetInterfaces()))
	indices := make(map[uint32]bool)
	names := make(map[string]bool)
	for i, in := range req.GetInterfaces() {
		ifc, err := validateInterface(in)
		if err != nil {
			return nil, nil, fmt.Errorf("interfaces[%d]: %w", i, err)
		}
		if indices[in.GetIndex()] {
			return nil, nil, invalidNet("interfaces[%d]: index %d given twice", i, in.GetIndex())
		}
		if names[ifc.name] {
			return nil, nil, invalidNet("interfaces[%d]: name %q given twice", i, ifc.name)
		}
		indices[in.GetIndex()], names[ifc.name] = true, true
		ifaces = append(ifaces, ifc)
	}
	routes := make([]netRoute, 0, len(req.GetRoutes()))
	for i, in := range req.GetRoutes() {
		r, err := validateRoute(in, names)
		if err != nil {
			return nil, nil, fmt.Errorf("routes[%d]: %w", i, err)
		}
		routes = append(routes, r)
	}
	return ifaces, routes, nil
}

func validateInterface(in *api.NetworkInterface) (netInterface, error) {
	ifc := netInterface{index: int(in.GetIndex()), name: in.GetName(), mtu: int(in.GetMtu())}
	if in.GetIndex() >= maxNetInterfaces {
		return ifc, invalidNet("index %d: at most %d", in.GetIndex(), maxNetInterfaces-1)
	}
	if !validIfname(ifc.name) {
		return ifc, invalidNet("name %q: want 1 to 15 bytes of [A-Za-z0-9_.-], not lo, . or ..", ifc.name)
	}
	mac, err := net.ParseMAC(in.GetMac())
	if err != nil {
		return ifc, invalidNet("%s: mac %q: %v", ifc.name, in.GetMac(), err)
	}
	if len(mac) != 6 {
		return ifc, invalidNet("%s: mac %q: not a 6-byte address", ifc.name, in.GetMac())
	}
	if mac[0]&1 != 0 {
		return ifc, invalidNet("%s: mac %q: multicast", ifc.name, in.GetMac())
	}
	if slices.Equal(mac, make(net.HardwareAddr, 6)) {
		return ifc, invalidNet("%s: mac %q: all zero", ifc.name, in.GetMac())
	}
	ifc.mac = mac
	if m := in.GetMtu(); m != 0 && (m < minMTU || m > maxMTU) {
		return ifc, invalidNet("%s: mtu %d: want 0 or %d to %d", ifc.name, m, minMTU, maxMTU)
	}
	if n := len(in.GetAddresses()); n > maxNetAddresses {
		return ifc, invalidNet("%s: %d addresses, more than %d", ifc.name, n, maxNetAddresses)
	}
	seen := make(map[netip.Addr]bool)
	for _, s := range in.GetAddresses() {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return ifc, invalidNet("%s: address %q: %v", ifc.name, s, err)
		}
		if p.Addr().Is4In6() {
			return ifc, invalidNet("%s: address %q: an IPv4-mapped IPv6 address", ifc.name, s)
		}
		if seen[p.Addr()] {
			return ifc, invalidNet("%s: address %q: given twice", ifc.name, s)
		}
		seen[p.Addr()] = true
		ifc.addrs = append(ifc.addrs, p)
	}
	return ifc, nil
}

// validIfname is whether name suits the kernel and the host: 1 to 15
// bytes (IFNAMSIZ less the NUL) of [A-Za-z0-9_.-], and not one the
// kernel refuses or the guest's loopback.
func validIfname(name string) bool {
	if len(name) == 0 || len(name) >= unix.IFNAMSIZ || name == "lo" || name == "." || name == ".." {
		return false
	}
	for _, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '.', c == '-':
		default:
			return false
		}
	}
	return true
}

func validateRoute(in *api.NetworkRoute, ifnames map[string]bool) (netRoute, error) {
	r := netRoute{iface: in.GetInterface(), metric: in.GetMetric()}
	if !ifnames[r.iface] {
		return r, invalidNet("interface %q: not one of the request's interfaces", r.iface)
	}
	if s := in.GetDestination(); s != "" {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return r, invalidNet("destination %q: %v", s, err)
		}
		if p.Addr().Is4In6() {
			return r, invalidNet("destination %q: an IPv4-mapped IPv6 address", s)
		}
		if p != p.Masked() {
			return r, invalidNet("destination %q: host bits set (the network is %s)", s, p.Masked())
		}
		r.dst = p
	}
	if s := in.GetGateway(); s != "" {
		a, err := parseRouteAddr(s)
		if err != nil {
			return r, invalidNet("gateway %q: %v", s, err)
		}
		r.gw = a
	}
	if !r.dst.IsValid() && !r.gw.IsValid() {
		return r, invalidNet("neither destination nor gateway")
	}
	if r.dst.IsValid() && r.gw.IsValid() && r.dst.Addr().Is6() != r.gw.Is6() {
		return r, invalidNet("gateway %s and destination %s of different families", r.gw, r.dst)
	}
	if s := in.GetSource(); s != "" {
		a, err := parseRouteAddr(s)
		if err != nil {
			return r, invalidNet("source %q: %v", s, err)
		}
		if a.Is6() != r.is6() {
			return r, invalidNet("source %s of another family than the route %s", a, r)
		}
		r.src = a
	}
	return r, nil
}

// parseRouteAddr parses a gateway or source: no zone (the route's
// interface is the zone) and no IPv4-mapped IPv6 address.
func parseRouteAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return a, err
	}
	if a.Zone() != "" {
		return a, errors.New("has a zone")
	}
	if a.Is4In6() {
		return a, errors.New("an IPv4-mapped IPv6 address")
	}
	return a, nil
}
