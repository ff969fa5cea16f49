package agent

import (
	"context"
	"fmt"

	"github.com/cocoonrt/cocoon/guest/api"
	"github.com/cocoonrt/cocoon/runtime/network"
)

// ConfigureNetwork gives the guest's interfaces (each cfg interface's
// Device, in the order of the VM's NICs) the names, MACs, MTUs and
// addresses of cfg's, and replaces the routes of an earlier call with
// cfg's.
func (c *Client) ConfigureNetwork(ctx context.Context, cfg network.Config) error {
	req := &api.ConfigureNetworkRequest{}
	for _, iface := range cfg.Interfaces {
		ni := &api.NetworkInterface{Index: uint32(max(iface.Device, 0)), Name: iface.Name, Mac: iface.MAC.String(), Mtu: uint32(max(iface.MTU, 0))}
		for _, a := range iface.Addresses {
			ni.Addresses = append(ni.Addresses, a.String())
		}
		req.Interfaces = append(req.Interfaces, ni)
	}
	for _, r := range cfg.Routes {
		nr := &api.NetworkRoute{Interface: r.Interface, Metric: uint32(max(r.Metric, 0))}
		if r.Destination.IsValid() {
			nr.Destination = r.Destination.String()
		}
		if r.Gateway.IsValid() {
			nr.Gateway = r.Gateway.String()
		}
		if r.Source.IsValid() {
			nr.Source = r.Source.String()
		}
		req.Routes = append(req.Routes, nr)
	}
	_, err := c.agent.ConfigureNetwork(ctx, req)
	return c.mapErr(fmt.Sprintf("configure the guest's network (%d interfaces, %d routes)", len(req.Interfaces), len(req.Routes)), err)
}
