package qemu

import (
	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu/qmp"
)

// machineOf describes the machine commandLine builds for spec: what a
// saved state of it needs to load again. Each device it names is one
// virtio-mmio device of the guest.
func machineOf(spec hypervisor.Spec, v qmp.Version) hypervisor.Machine {
	agent := "agent:virtio-serial"
	if spec.Channel == channel.Vsock {
		agent = "agent:vhost-vsock"
	}
	devices := []string{"virtio-rng", "virtio-scsi:" + SCSIControllerID, agent}
	// The share and the NICs come last, as on the command line: a guest
	// without them keeps the list, and so the template keys, it had
	// before them.
	if sh := spec.Share; sh != nil {
		devices = append(devices, "virtio-fs:"+sh.Tag)
	}
	for _, n := range spec.NICs {
		devices = append(devices, "virtio-net:"+n.ID)
	}
	return hypervisor.Machine{
		Driver:  DriverName,
		Version: v.String(),
		Type:    "microvm",
		Devices: devices,
	}
}

// Machine says what machine the VM is.
func (v *VM) Machine() hypervisor.Machine { return v.machine }

var _ hypervisor.Describer = (*VM)(nil)
