package harness

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// reserveNetSlot picks one of slots (0 to slots-1) for a private network
// of a test, that no other user on the host holds: one whose subnets no
// route of the host's overlaps and whose bridge does not exist, held by
// an abstract unix socket named lock and the slot, which the kernel
// releases when the socket is closed or the process ends, so that a
// crashed test holds nothing. The caller closes the socket once the
// network is gone.
func reserveNetSlot(slots int, lock string, bridge func(slot int) string, subnets func(slot int) []*net.IPNet) (int, net.Listener, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return 0, nil, fmt.Errorf("list the host's routes: %w", err)
	}
	for slot := range slots {
		if routedAny(routes, subnets(slot)) {
			continue
		}
		if _, err := netlink.LinkByName(bridge(slot)); err == nil {
			continue
		}
		l, err := net.Listen("unix", fmt.Sprintf("@%s%d", lock, slot))
		if err != nil {
			continue // another's
		}
		return slot, l, nil
	}
	return 0, nil, fmt.Errorf("all %d slots are held", slots)
}

// routedAny reports whether a route's destination other than the default
// overlaps one of subnets.
func routedAny(routes []netlink.Route, subnets []*net.IPNet) bool {
	for _, s := range subnets {
		if routed(routes, s) {
			return true
		}
	}
	return false
}

// routed reports whether a route's destination other than the default
// overlaps subnet.
func routed(routes []netlink.Route, subnet *net.IPNet) bool {
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if ones, _ := r.Dst.Mask.Size(); ones == 0 {
			continue
		}
		if r.Dst.Contains(subnet.IP) || subnet.Contains(r.Dst.IP) {
			return true
		}
	}
	return false
}
