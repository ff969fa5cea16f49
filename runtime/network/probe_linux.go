package network

import (
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// VhostNetDevice is where vhost-net is, which QEMU uses for the NICs
// under KVM.
const VhostNetDevice = "/dev/vhost-net"

// Probe checks that this host can mirror a network namespace: in a
// throwaway namespace of its own it makes two taps and redirects each to
// the other with tc, as Plumb does. It returns what failed, naming the
// step (the tun device, the ingress qdisc, the u32 filter with its mirred
// action).
func Probe() error {
	ns, err := newNamespace()
	if err != nil {
		return fmt.Errorf("make a network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	p := &Plumbed{Path: "(probe)", handle: h}
	var taps []*os.File
	defer func() {
		for _, t := range taps {
			t.Close()
		}
	}()
	for i := 0; i < 2; i++ {
		t, err := openTap(ns, fmt.Sprintf("%s%d", tapPrefix, i))
		if err != nil {
			return err
		}
		taps = append(taps, t)
	}
	a, err := h.LinkByName(tapPrefix + "0")
	if err != nil {
		return err
	}
	return p.redirect(a, tapPrefix+"1")
}

// newNamespace makes a network namespace and returns a handle of it,
// from a thread that returns to its own namespace after.
func newNamespace() (netns.NsHandle, error) {
	ns := netns.None()
	err := onNamespaceThread(func() (err error) {
		ns, err = netns.New()
		return err
	}, func() error { return nil })
	if err != nil && ns.IsOpen() {
		ns.Close()
		ns = netns.None()
	}
	return ns, err
}
