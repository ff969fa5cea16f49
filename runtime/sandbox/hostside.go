package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

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
		for i, iface := range s.host.net.Config.Interfaces {
			spec.NICs = append(spec.NICs, hypervisor.NIC{ID: fmt.Sprintf("net%d", i), Tap: s.host.net.Taps[i], MAC: iface.MAC, MTU: iface.MTU})
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
