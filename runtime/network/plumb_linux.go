package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"unsafe"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// MaxInterfaces bounds the interfaces mirrored from one namespace.
const MaxInterfaces = 16

// tapPrefix names the taps Plumb makes (cctap0, cctap1, ...); links with
// it are never taken for the namespace's own interfaces.
const tapPrefix = "cctap"

// processNamespace is the path of a running process's network namespace,
// which another container's processes are in.
var processNamespace = regexp.MustCompile(`^/proc/([0-9]+)/ns/net$`)

// Plumbed is a namespace whose interfaces were connected to taps.
type Plumbed struct {
	// Path is the namespace's path.
	Path string
	// Config is what the guest's network is to be.
	Config Config
	// Taps are the tap devices, opened, one per NIC of the VM in its
	// order: the namespace's interfaces' at Plumb, in Config.Interfaces'
	// order, then the spares AddSpares made. Close closes them.
	Taps []*os.File

	ns     netns.NsHandle
	handle *netlink.Handle
	// redirected are the indexes of the namespace's interfaces that got
	// an ingress qdisc.
	redirected []int
	// mirrored names the namespace's interfaces that have a tap, by
	// link index.
	mirrored map[int]string
	// spares are the NICs (indexes into Taps) whose taps forward
	// nothing yet, in order; BindLate takes them.
	spares []int
}

// Plumb finds the interfaces of the network namespace at path and
// connects each to a new tap: the tap is made in the namespace, and tc
// redirects all ingress of each to the other. A namespace with no
// interface but loopback gives an empty Config and no tap. On error
// nothing is left.
func Plumb(path string) (_ *Plumbed, retErr error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	p := &Plumbed{Path: path, ns: ns, mirrored: map[int]string{}}
	defer func() {
		if retErr != nil {
			p.Close()
		}
	}()
	if p.handle, err = netlink.NewHandleAt(ns); err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	if tap, err := p.handle.LinkByName(tapName(0)); err == nil {
		// Its interfaces' frames go to another VM's tap already (Docker's
		// --network container:<id>, which joins another container's
		// namespace); one interface can be redirected to one tap only.
		return nil, fmt.Errorf("network namespace %s is mirrored into another VM already (it has its tap %s): a namespace's interfaces can stand in one VM only, so a container cannot join the network of a container in another Cocoon VM: %w",
			path, tap.Attrs().Name, errdefs.ErrNotImplemented)
	}
	if m := processNamespace.FindStringSubmatch(filepath.Clean(path)); m != nil {
		return nil, fmt.Errorf("network namespace %s is process %s's (Docker's and nerdctl's --network container:<id> name another container's so): its interfaces are that container's, and mirroring them into a VM would take them from it; "+
			"bind-mount the namespace to a file and join that: %w", path, m[1], errdefs.ErrNotImplemented)
	}
	links, err := p.unmirrored()
	if err != nil {
		return nil, err
	}
	if len(links) > MaxInterfaces {
		return nil, fmt.Errorf("network namespace %s: %d interfaces, at most %d: %w", path, len(links), MaxInterfaces, errdefs.ErrNotImplemented)
	}
	for i, l := range links {
		tap, err := openTap(ns, tapName(i))
		if err != nil {
			return nil, fmt.Errorf("network namespace %s: %s: %w", path, l.Attrs().Name, err)
		}
		p.Taps = append(p.Taps, tap)
		if err := p.mirror(l, i); err != nil {
			return nil, err
		}
	}
	if p.Config.Routes, err = p.routes(); err != nil {
		return nil, err
	}
	return p, nil
}

// tapName is the name of the tap of the VM's NIC i.
func tapName(i int) string { return fmt.Sprintf("%s%d", tapPrefix, i) }

// unmirrored lists the namespace's interfaces that have no tap yet: every
// link with a 6-byte hardware address but loopback and the taps.
func (p *Plumbed) unmirrored() ([]netlink.Link, error) {
	links, err := dumpLinks(p.handle)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: list links: %w", p.Path, err)
	}
	var out []netlink.Link
	for _, l := range links {
		a := l.Attrs()
		if _, done := p.mirrored[a.Index]; done || a.Flags&net.FlagLoopback != 0 || strings.HasPrefix(a.Name, tapPrefix) || len(a.HardwareAddr) != 6 {
			continue
		}
		out = append(out, l)
	}
	return out, nil
}

// dumpLinks lists h's links, again when the kernel says a change
// interrupted the dump (a client adding interfaces as it is read).
func dumpLinks(h *netlink.Handle) ([]netlink.Link, error) {
	var (
		links []netlink.Link
		err   error
	)
	for range 5 {
		if links, err = h.LinkList(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return links, err
}

// mirror connects interface l to the tap of the VM's NIC device, which
// must be open in Taps, and adds it to Config.Interfaces.
func (p *Plumbed) mirror(l netlink.Link, device int) error {
	iface, err := p.describe(l)
	if err != nil {
		return err
	}
	iface.Device = device
	if err := p.redirect(l, tapName(device)); err != nil {
		return fmt.Errorf("network namespace %s: %s: %w", p.Path, iface.Name, err)
	}
	p.mirrored[l.Attrs().Index] = iface.Name
	p.Config.Interfaces = append(p.Config.Interfaces, iface)
	return nil
}

// AddSpares makes n more taps in the namespace, each for a NIC of the VM
// that stands in for no interface yet: they forward nothing until
// BindLate binds an interface that appeared after Plumb to one. A client
// that fills the namespace after the VM booted (Docker 26 and later,
// between the task's Create and Start) needs them, since the VM's NICs
// are fixed at its boot.
func (p *Plumbed) AddSpares(n int) error {
	if len(p.Taps)+n > MaxInterfaces {
		return fmt.Errorf("network namespace %s: %d interfaces and %d spare NICs, at most %d: %w", p.Path, len(p.Taps), n, MaxInterfaces, errdefs.ErrNotImplemented)
	}
	for range n {
		i := len(p.Taps)
		tap, err := openTap(p.ns, tapName(i))
		if err != nil {
			return fmt.Errorf("network namespace %s: spare NIC %d: %w", p.Path, i, err)
		}
		p.Taps = append(p.Taps, tap)
		p.spares = append(p.spares, i)
	}
	return nil
}

// Spares is how many spare NICs are not bound yet.
func (p *Plumbed) Spares() int { return len(p.spares) }

// BindLate mirrors the interfaces that appeared in the namespace since
// Plumb (or the last BindLate), each onto the next spare NIC, and reads
// the routes again. It reports how many it bound: with one or more, the
// guest is to be configured again with Config. More new interfaces than
// spares is an error naming them, and binds none. Bound spares stay
// bound; interfaces that went away are not unbound.
func (p *Plumbed) BindLate() (int, error) {
	links, err := p.unmirrored()
	if err != nil || len(links) == 0 {
		return 0, err
	}
	if len(links) > len(p.spares) {
		names := make([]string, len(links))
		for i, l := range links {
			names[i] = l.Attrs().Name
		}
		return 0, fmt.Errorf("network namespace %s: interfaces %s appeared after the VM booted, and it has %d spare NICs for them (a microvm cannot add one): %w",
			p.Path, strings.Join(names, ", "), len(p.spares), errdefs.ErrNotImplemented)
	}
	for _, l := range links {
		if err := p.mirror(l, p.spares[0]); err != nil {
			return 0, err
		}
		p.spares = p.spares[1:]
	}
	if p.Config.Routes, err = p.routes(); err != nil {
		return 0, err
	}
	return len(links), nil
}

// describe reads what the guest needs of link l.
func (p *Plumbed) describe(l netlink.Link) (Interface, error) {
	a := l.Attrs()
	iface := Interface{Name: a.Name, MAC: append([]byte(nil), a.HardwareAddr...), MTU: a.MTU}
	addrs, err := p.handle.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return iface, fmt.Errorf("network namespace %s: %s: addresses: %w", p.Path, a.Name, err)
	}
	for _, ad := range addrs {
		ip, ok := netip.AddrFromSlice(ad.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is6() && ip.IsLinkLocalUnicast() {
			continue
		}
		ones, _ := ad.Mask.Size()
		iface.Addresses = append(iface.Addresses, netip.PrefixFrom(ip, ones))
	}
	return iface, nil
}

// routes are the namespace's main-table routes on the mirrored
// interfaces, without those the kernel makes for addresses.
func (p *Plumbed) routes() ([]Route, error) {
	rs, err := p.handle.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: routes: %w", p.Path, err)
	}
	var out []Route
	for _, r := range rs {
		name, ok := p.mirrored[r.LinkIndex]
		if !ok || r.Protocol == unix.RTPROT_KERNEL || r.Type != unix.RTN_UNICAST {
			continue
		}
		rt := Route{Interface: name, Metric: r.Priority}
		if r.Dst != nil {
			ip, ok := netip.AddrFromSlice(r.Dst.IP)
			if !ok {
				continue
			}
			ones, _ := r.Dst.Mask.Size()
			rt.Destination = netip.PrefixFrom(ip.Unmap(), ones)
			if ones == 0 {
				rt.Destination = netip.Prefix{}
			}
		}
		if ip, ok := netip.AddrFromSlice(r.Gw); ok {
			rt.Gateway = ip.Unmap()
		}
		if ip, ok := netip.AddrFromSlice(r.Src); ok {
			rt.Source = ip.Unmap()
		}
		if !rt.Destination.IsValid() && !rt.Gateway.IsValid() {
			continue
		}
		if rt.Destination.IsValid() && rt.Destination.Addr().Is6() && rt.Destination.Addr().IsLinkLocalUnicast() {
			continue
		}
		out = append(out, rt)
	}
	return out, nil
}

// redirect brings the tap up with l's MTU and redirects every frame that
// arrives on either to the other.
func (p *Plumbed) redirect(l netlink.Link, tapName string) error {
	t, err := p.handle.LinkByName(tapName)
	if err != nil {
		return fmt.Errorf("find %s: %w", tapName, err)
	}
	if err := p.handle.LinkSetMTU(t, l.Attrs().MTU); err != nil {
		return fmt.Errorf("%s: set mtu: %w", tapName, err)
	}
	if err := p.handle.LinkSetUp(t); err != nil {
		return fmt.Errorf("%s: up: %w", tapName, err)
	}
	for _, pair := range [][2]netlink.Link{{l, t}, {t, l}} {
		from, to := pair[0].Attrs(), pair[1].Attrs()
		q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: from.Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
		if err := p.handle.QdiscAdd(q); err != nil {
			return fmt.Errorf("%s: add ingress qdisc: %w", from.Name, err)
		}
		if from.Index == l.Attrs().Index {
			p.redirected = append(p.redirected, from.Index)
		}
		f := &netlink.U32{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: from.Index, Parent: netlink.MakeHandle(0xffff, 0), Priority: 1, Protocol: unix.ETH_P_ALL},
			RedirIndex:  to.Index,
		}
		if err := p.handle.FilterAdd(f); err != nil {
			return fmt.Errorf("%s: redirect to %s: %w", from.Name, to.Name, err)
		}
	}
	return nil
}

// Close removes the redirects from the namespace's interfaces and closes
// the taps, which the kernel then removes with theirs once the VMM has
// let go of them too. The namespace itself is its owner's. Safe to call
// more than once.
func (p *Plumbed) Close() error {
	var errs []error
	for _, idx := range p.redirected {
		q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
		if err := p.handle.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("network namespace %s: remove ingress qdisc of link %d: %w", p.Path, idx, err))
		}
	}
	p.redirected = nil
	for _, t := range p.Taps {
		t.Close()
	}
	p.Taps = nil
	if p.handle != nil {
		p.handle.Close()
		p.handle = nil
	}
	if p.ns.IsOpen() {
		p.ns.Close()
	}
	return errors.Join(errs...)
}

// openTap makes tap name in namespace ns and returns it open: IFF_TAP
// with IFF_VNET_HDR, for virtio-net's offloads, and IFF_NO_PI. A tap is
// made in the namespace of the thread that asks, so the ask runs on a
// thread in ns; the descriptor works from anywhere after.
func openTap(ns netns.NsHandle, name string) (*os.File, error) {
	var f *os.File
	err := onNamespaceThread(func() error { return netns.Set(ns) }, func() (err error) {
		f, err = tunSetIff(name)
		return err
	})
	if err != nil && f != nil {
		f.Close()
		f = nil
	}
	return f, err
}

// onNamespaceThread runs fn on a thread of its own that enter moved into
// a network namespace, then moves the thread back to its namespace. A
// thread that cannot go back stays locked, and ends with its goroutine:
// it never runs anything else in the wrong namespace.
func onNamespaceThread(enter func() error, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer orig.Close()
		if err := enter(); err != nil {
			// enter may have moved the thread before it failed.
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
			done <- fmt.Errorf("enter the namespace: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			done <- fmt.Errorf("leave the namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// ifReq is struct ifreq as TUNSETIFF reads it.
type ifReq struct {
	Name  [unix.IFNAMSIZ]byte
	Flags uint16
	_     [22]byte
}

func tunSetIff(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var req ifReq
	copy(req.Name[:], name)
	req.Flags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req))); errno != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("make tap %s: %w", name, errno)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}
