// Package network mirrors a sandbox's network namespace into its VM.
//
// The namespace is the one a container's spec names (made by CNI through
// CRI or nerdctl, or by Docker). Each of its interfaces (the veth that CNI
// or Docker put there) gets a tap device next to it, in the same
// namespace, and tc redirects every frame from one to the other, both
// ways: the guest's virtio-net interface, backed by the tap, stands in
// for the veth, with the veth's MAC, MTU, addresses and routes (given to
// the guest by its agent). The host's side (bridge, NAT, published ports)
// sees the veth as it would with runc. The VMM gets the taps as open
// descriptors and opens nothing of the network itself.
//
// The namespace is left to its owner: Close removes the redirects; the
// taps go when the last descriptor of each is closed.
package network

import (
	"net"
	"net/netip"
)

// Interface is an interface of the sandbox's network namespace, as the
// guest is to have it.
type Interface struct {
	// Device is the index of the guest's NIC that stands in for it, in
	// the order of the VM's NICs.
	Device int
	// Name is the interface's name in the namespace (eth0).
	Name string
	// MAC is its hardware address.
	MAC net.HardwareAddr
	// MTU is its MTU.
	MTU int
	// Addresses are its addresses, without IPv6 link-local ones (the
	// guest makes those itself, from the same MAC).
	Addresses []netip.Prefix
}

// Route is a route of the namespace's main table that the guest needs:
// not one the kernel makes for an address (the guest's kernel makes it
// too).
type Route struct {
	// Destination is invalid (the zero Prefix) for a default route.
	Destination netip.Prefix
	// Gateway is invalid for a route on the link.
	Gateway netip.Addr
	// Interface is the name of the interface the route goes out of.
	Interface string
	// Source is the preferred source address, if any.
	Source netip.Addr
	// Metric is the route's priority.
	Metric int
}

// Config is what the guest's network is to be.
type Config struct {
	Interfaces []Interface
	Routes     []Route
}
