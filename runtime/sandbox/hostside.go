package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/guest/api"
	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/network"
	"github.com/cocoonrt/cocoon/runtime/portfwd"
	"github.com/cocoonrt/cocoon/runtime/share"
)

// netnsFileName is the file in the state directory where a network
// namespace that the sandbox made is bind-mounted.
const netnsFileName = "netns"

// hostSide is what a sandbox keeps on the host besides its VM: the
// plumbing of its network namespace, the process that holds it, the
// forwarding of its loopback into the guest, and the share of its
// containers' bind mounts.
type hostSide struct {
	// net is the plumbing of the namespace; nil without one.
	net *network.Plumbed
	// holder keeps a process in the namespace for OCI hooks; nil
	// without one.
	holder *network.Holder
	// share holds the containers' bind mounts; nil without one.
	share *share.Dir
	// ports forwards the namespace's loopback into the guest
	// (portfwd.go); nil without a namespace, or when it could not.
	ports *portfwd.Forwarder
	// beforeRan: Options.BeforeNetwork was called.
	beforeRan bool
	// mu makes one bindLateInterfaces run at a time.
	mu sync.Mutex
}

// setUpHost makes what the VM of o needs on the host before it launches,
// and adds its devices to spec: the network namespace (made, or joined)
// held for hooks, o.BeforeNetwork run in it, its interfaces mirrored as
// NICs, and the share.
func (s *Sandbox) setUpHost(ctx context.Context, o Options, spec *hypervisor.Spec) error {
	path := o.NetNS
	switch {
	case o.NewNetNS && path != "":
		return fmt.Errorf("sandbox network: both a namespace to join (%s) and one to make: %w", path, errdefs.ErrInvalidArgument)
	case o.NewNetNS:
		h, err := network.NewNamespace(filepath.Join(s.Dir, netnsFileName))
		if err != nil {
			return err
		}
		s.host.holder, path = h, h.Path()
	case o.HoldNetNS && path != "":
		h, err := network.Join(path)
		if err != nil {
			return err
		}
		s.host.holder = h
	}
	if o.SpareNICs > 0 && path == "" {
		return fmt.Errorf("sandbox network: %d spare NICs and no namespace to bind them in: %w", o.SpareNICs, errdefs.ErrInvalidArgument)
	}
	if o.BeforeNetwork != nil {
		s.host.beforeRan = true
		if err := o.BeforeNetwork(ctx, s.HookPID()); err != nil {
			return err
		}
	}
	if path != "" {
		var err error
		if s.host.net, err = network.Plumb(path); err != nil {
			return err
		}
		if o.SpareNICs > 0 {
			if err := s.host.net.AddSpares(o.SpareNICs); err != nil {
				return err
			}
		}
		for i, tap := range s.host.net.Taps {
			nic := hypervisor.NIC{ID: fmt.Sprintf("net%d", i), Tap: tap}
			if i < len(s.host.net.Config.Interfaces) {
				iface := s.host.net.Config.Interfaces[i]
				nic.MAC, nic.MTU = iface.MAC, iface.MTU
			} else if nic.MAC, err = spareMAC(); err != nil {
				return err
			}
			spec.NICs = append(spec.NICs, nic)
		}
		spec.NetNS = path
		s.forwardPorts(context.WithoutCancel(ctx), path)
	}
	if o.Share {
		d, err := share.New(s.Dir)
		if err != nil {
			return err
		}
		s.host.share = d
		spec.Share = &hypervisor.Share{Tag: api.ShareTag, Dir: d.Root()}
	}
	return nil
}

// spareMAC is a spare NIC's hardware address until an interface is
// bound to it: random, locally administered, unicast. The agent gives the
// guest's interface the bound interface's at BindLate.
func spareMAC() (net.HardwareAddr, error) {
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return nil, fmt.Errorf("spare NIC: %w", err)
	}
	mac[0] = mac[0]&^0x01 | 0x02
	return mac, nil
}

// bindLateInterfaces mirrors into the guest the interfaces that appeared
// in the sandbox's namespace since its boot, onto its spare NICs, and
// configures the guest's network again. Docker 26 and later add them
// between the task's Create and Start, through the task's pid, and the
// first container's Start calls this: by then the client has finished,
// so nothing is polled or waited for. A no-op without spares left.
func (s *Sandbox) bindLateInterfaces(ctx context.Context) error {
	s.host.mu.Lock()
	defer s.host.mu.Unlock()
	n := s.host.net
	if n == nil || n.Spares() == 0 {
		return nil
	}
	bound, err := n.BindLate()
	if err != nil || bound == 0 {
		return err
	}
	if err := s.agent.ConfigureNetwork(ctx, n.Config); err != nil {
		return err
	}
	log.G(ctx).WithFields(log.Fields{
		"netns": n.Path, "bound": bound, "interfaces": len(n.Config.Interfaces),
		"routes": len(n.Config.Routes), "spares_left": n.Spares(),
	}).Info("guest network configured with interfaces added after the boot")
	return nil
}

// HookPID is the host pid that the OCI hooks of the sandbox's containers
// get in their state: the holder's, a process in the sandbox's network
// namespace, or without one the VMM's.
func (s *Sandbox) HookPID() int {
	if s.host.holder != nil {
		return s.host.holder.PID()
	}
	if s.vm != nil {
		return s.vm.PID()
	}
	return 0
}

// shareBinds makes the bind mounts of a container's spec in the share.
func (s *Sandbox) shareBinds(ctx context.Context, c ContainerSpec) error {
	binds := oci.Binds(c.Spec)
	if len(binds) == 0 {
		return nil
	}
	if s.host.share == nil {
		return fmt.Errorf("container %s has bind mounts (%s, ...), and its sandbox was started without a share (virtio-fs): %w", c.ID, binds[0].Destination, errdefs.ErrFailedPrecondition)
	}
	if err := s.host.share.Add(c.ID, binds); err != nil {
		return fmt.Errorf("container %s: %w", c.ID, err)
	}
	log.G(ctx).WithField("binds", len(binds)).Debug("bind mounts shared")
	return nil
}

// unshareBinds undoes shareBinds.
func (s *Sandbox) unshareBinds(id string) error {
	if s.host.share == nil {
		return nil
	}
	return s.host.share.Remove(id)
}

// closeHost releases what setUpHost made, once the VM has stopped: the
// taps are no longer in use, nor the share. The namespace itself is its
// owner's (CNI's DEL, Docker), or with the holder's file gone, the
// kernel's to free.
func (s *Sandbox) closeHost() error {
	var errs []error
	if s.host.ports != nil {
		if err := s.host.ports.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.host.net != nil {
		if err := s.host.net.Close(); err != nil {
			errs = append(errs, fmt.Errorf("network: %w", err))
		}
	}
	if s.host.holder != nil {
		if err := s.host.holder.Close(); err != nil {
			errs = append(errs, fmt.Errorf("network namespace holder: %w", err))
		}
	}
	if s.host.share != nil {
		if err := s.host.share.Close(); err != nil {
			errs = append(errs, fmt.Errorf("share: %w", err))
		}
	}
	return errors.Join(errs...)
}
