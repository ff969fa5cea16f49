// Package hypervisor is the boundary between the sandbox lifecycle and the
// virtual machine monitors that run guests. A driver (qemu first; Cloud
// Hypervisor and Firecracker fit the same shape) turns a Spec into a running
// VM; everything it needs is in the Spec and everything the sandbox needs
// back is on the VM. Drivers live in their own packages and import this one,
// never the reverse.
package hypervisor

import (
	"context"
	"errors"

	"github.com/cocoonrt/cocoon/runtime/channel"
)

// Spec describes one guest to launch. Drivers add their own devices and
// arguments; a Spec never carries raw VMM arguments.
type Spec struct {
	// ID names the sandbox; drivers use it in process titles and logs.
	ID string
	// StateDir is the sandbox's private directory (0700). The driver keeps
	// its sockets, pid file and console log there and removes what it made
	// when the VM stops.
	StateDir string
	// Kernel and Initrd are the guest image files.
	Kernel string
	Initrd string
	// KernelArgs are appended to the driver's own kernel command line.
	KernelArgs []string
	// KernelHZ is the guest kernel's timer frequency (CONFIG_HZ), which
	// drivers need to precompute the delay loop; 0 if unknown.
	KernelHZ int
	// VCPUs and MemoryMiB size the guest.
	VCPUs     int
	MemoryMiB int
	// Accel is the resolved accelerator.
	Accel Accel
	// Channel is the resolved agent transport.
	Channel channel.Kind
	// ConsoleLogBytes bounds the console log kept in StateDir.
	ConsoleLogBytes int64
}

// Driver launches guests with one kind of VMM.
type Driver interface {
	// Name is the driver's name as used in the configuration ("qemu").
	Name() string
	// Launch starts the VMM for spec and returns once the VMM runs and
	// answers on its control socket. It does not wait for the guest to
	// boot. On error nothing is left running and the files it made are
	// removed.
	Launch(ctx context.Context, spec Spec) (VM, error)
}

// VM is one running guest.
type VM interface {
	// PID is the VMM's process id on the host.
	PID() int
	// AgentEndpoint says how to reach the guest agent.
	AgentEndpoint() channel.Endpoint
	// Exited is closed as soon as the VMM process has exited.
	Exited() <-chan struct{}
	// ExitError says how the VMM exited: nil for a clean guest power-off.
	// Valid once Exited is closed.
	ExitError() error
	// ConsoleTail returns up to n of the last lines the guest wrote to its
	// console.
	ConsoleTail(n int) []string
	// Stop ends the VMM if it still runs, escalating from a graceful quit
	// to SIGTERM and then SIGKILL as ctx's deadline nears, reaps it and
	// removes the files the driver made. Safe to call more than once.
	Stop(ctx context.Context) error
}

// ErrVMExited is wrapped by errors that arise because the VMM process is
// gone.
var ErrVMExited = errors.New("vm exited")

// DiskAddr is where a hot-plugged disk sits on the guest's SCSI
// controller: /sys/bus/scsi/devices/0:0:<SCSIID>:<LUN> in the guest.
type DiskAddr struct {
	SCSIID uint32
	LUN    uint32
}

// DiskAttacher is implemented by VMs that can hot-plug disks after boot.
// Container root filesystems arrive this way: microvm's virtio-mmio
// devices cannot be hot-plugged, so disks go onto the SCSI controller
// every guest gets at boot.
type DiskAttacher interface {
	// AttachDisk hot-plugs the file at path as a SCSI disk named id
	// (unique within the VM) and returns its address once the VMM has
	// added it. The guest sees it shortly after.
	AttachDisk(ctx context.Context, id, path string, readOnly bool) (DiskAddr, error)
	// DetachDisk unplugs the disk named id and releases the file.
	DetachDisk(ctx context.Context, id string) error
}
