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
	"net"
	"os"

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
	// Memory, if set, puts guest RAM in a file instead of anonymous
	// memory: the base of templates, whose clones map one saved memory
	// copy-on-write. Nil: anonymous memory.
	Memory *MemoryFile
	// NICs are the guest's network interfaces, in order: each a
	// virtio-net device backed by a tap the caller made and opened. They
	// exist from boot (microvm cannot hot-plug them) and are part of the
	// machine a saved state needs: a restore gets as many, with backends
	// of its own.
	NICs []NIC
	// NetNS, if set, is the path of the network namespace the VMM runs
	// in: the sandbox's, whose interfaces the NICs mirror. The VMM opens
	// nothing of the network itself (its taps are given), but its pid is
	// what containerd's clients see as the task's, and they look for the
	// container's network at /proc/<pid>/ns/net (nerdctl inspect,
	// --net container:<id>), as they do for runc's init.
	NetNS string
	// Share, if set, exports a host directory to the guest through
	// virtio-fs: one file server per sandbox, started before the VM and
	// ended with it. A VM with a share cannot be saved (Snapshotter.Save
	// refuses it with errdefs.ErrNotImplemented) nor restored into, and
	// its RAM must be shareable with the file server: anonymous RAM, or
	// a shared MemoryFile.
	Share *Share
	// Restore, if set, makes Launch bring back a state saved by
	// Snapshotter.Save instead of booting the kernel. The other fields
	// must describe the guest as it was launched when it was saved
	// (sizes, accelerator, channel, image): the saved state holds the
	// guest's memory and devices, not its machine. Nil boots as usual.
	Restore *Restore
}

// NIC is a network interface of the guest, backed by a tap device.
type NIC struct {
	// ID names the NIC to the driver: net0, net1, ... in order.
	ID string
	// Tap is the tap device, opened on /dev/net/tun with IFF_TAP,
	// IFF_NO_PI and IFF_VNET_HDR in the sandbox's network namespace. The
	// driver hands it to the VMM, which opens nothing of the network
	// itself; the caller keeps and closes it.
	Tap *os.File
	// MAC is the guest interface's hardware address.
	MAC net.HardwareAddr
	// MTU is told to the guest; 0 leaves the default.
	MTU int
}

// Share is a host directory the guest mounts with mount -t virtiofs.
type Share struct {
	// Tag is the name the guest mounts it by: 1 to 36 bytes of
	// [A-Za-z0-9._-].
	Tag string
	// Dir is the host directory, absolute. Mounts made under it after
	// launch reach the guest when Dir receives mount propagation (a
	// shared mount, or a slave of one: the caller makes it so): the
	// file server's copy of the host's mounts is their slave. Each
	// mount under Dir is a mount of its own in the guest too, with its
	// own device number, so that inode numbers of different host
	// filesystems never collide.
	Dir string
}

// MemoryFile is guest RAM backed by a file of Spec.MemoryMiB bytes.
//
// Shared (the template's own VM) maps the file shared: the guest's
// writes go to the file, and a Save leaves RAM out of the saved state,
// which then holds only the devices and vCPUs (the file is the memory).
// Not shared (a clone) maps it privately: the guest reads the file's
// pages until it writes them, then has its own copy, so pages a clone
// never writes stay one copy in the host's page cache for every clone.
// A clone restores a state saved from the shared VM, with the same file.
type MemoryFile struct {
	// Path is the file; it must exist for a private mapping.
	Path   string
	Shared bool
}

// Restore is what Launch needs to bring a saved VM back.
type Restore struct {
	// State is the file Save wrote, open for reading at its start. The
	// driver reads it during Launch and does not close it; the host
	// opens it, so the VMM needs no access to its path.
	State *os.File
	// Disks are the disks that were attached when the state was saved
	// (SavedState.Disks), at the same addresses; a path may differ (a
	// copy of a scratch disk, a layer image at another place). Launch
	// attaches them before the state loads: the guest's drivers expect
	// them where they were.
	Disks []Disk
	// Resume leaves the restored guest running; false leaves it paused
	// until Snapshotter.Resume.
	Resume bool
	// Check, if set, is given the machine the VMM started as, before
	// anything is loaded into it; an error ends the launch with that
	// error. A state saved by another VMM version or on another machine
	// model is refused this way, with a reason, rather than by the VMM
	// failing to load it.
	Check func(Machine) error
}

// Disk is one hot-plugged disk as a restore must recreate it.
type Disk struct {
	// ID is the name the disk was attached under.
	ID string
	// Path is the disk image on the host.
	Path string
	// ReadOnly says whether the guest sees it write-protected.
	ReadOnly bool
	// Addr is where it sits on the guest's SCSI controller.
	Addr DiskAddr
}

// SavedState describes what Save wrote.
type SavedState struct {
	// Disks are the disks attached at the time of the save, which the
	// caller records and hands back in Restore.Disks.
	Disks []Disk
	// Bytes is the size of the state written.
	Bytes int64
}

// Snapshotter is implemented by VMs whose whole state (vCPUs, devices,
// guest memory) can be saved to a file and brought back into a new VMM
// with Spec.Restore: the base of checkpoints and templates. Disks are not
// in the saved state; their files are the caller's to keep consistent
// with it (copied while the VM is paused, or never written).
type Snapshotter interface {
	// Pause stops the guest's vCPUs. Pausing a paused VM is a no-op.
	Pause(ctx context.Context) error
	// Resume lets a paused guest run again, also after a Save.
	Resume(ctx context.Context) error
	// Save writes the paused VM's state to w from its current offset
	// and returns once it is all written. A running VM is refused with
	// errdefs.ErrFailedPrecondition. The VM stays paused and can be
	// resumed or stopped. w stays the caller's to sync and close.
	Save(ctx context.Context, w *os.File) (SavedState, error)
}

// Machine is what a saved state depends on besides the Spec's sizes: the
// VMM and its version, the machine model and the devices the guest had
// from boot. A snapshot records it and a restore compares it: a state
// loads only into the same machine.
type Machine struct {
	// Driver is the driver's name; Version the VMM's version.
	Driver  string
	Version string
	// Type is the machine model (QEMU's -M).
	Type string
	// Devices name the boot-time devices in order, with the backend
	// kind where it matters ("agent:virtio-serial").
	Devices []string
}

// Describer is implemented by VMs that can say what machine they are.
type Describer interface {
	Machine() Machine
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

// Plan is what a driver can say about the VM a Spec would launch, without
// launching it: the key of templates, which must change whenever a saved
// state of that VM might no longer load.
type Plan struct {
	// Driver is the driver's name.
	Driver string
	// VMM is the VMM executable as resolved, and VMMID its identity on
	// disk (device, inode, size, modification time): a new build or
	// package of the VMM changes it, so its saved states are not taken
	// for states of the new one. The version itself is known only once
	// the VMM runs (Machine.Version), and a restore checks it then.
	VMM   string
	VMMID string
	// Type is the machine model and Devices the boot-time device set, as
	// Machine names them.
	Type    string
	Devices []string
}

// Planner is implemented by drivers that can plan a launch.
type Planner interface {
	Plan(spec Spec) (Plan, error)
}

// Handoff is a running VM passed from the process that launched it to
// another, which takes it over (a spare VM claimed by a sandbox): what
// the receiver needs besides the files that go with it.
type Handoff struct {
	// Driver is the driver that launched the VM.
	Driver string `json:"driver"`
	// PID is the VMM's process id; Name what tells that process from any
	// other (QEMU's -name).
	PID  int    `json:"pid"`
	Name string `json:"name"`
	// StateDir is the directory the VM was launched in. The receiver
	// moves it to its own place before it adopts the VM.
	StateDir string `json:"state_dir"`
	// Machine is the machine as it runs.
	Machine Machine `json:"machine"`
	// Endpoint is the agent's; a serial socket path is relative to the
	// state directory.
	Endpoint channel.Endpoint `json:"endpoint"`
	// Memory is the VM's RAM file, if it has one.
	Memory *MemoryFile `json:"memory,omitempty"`
}

// Detacher is implemented by VMs that can be handed to another process.
type Detacher interface {
	// Detach stops watching the VM and returns what another process
	// needs to take it over, with the files that go with it (in the
	// order the driver's Adopt wants them). The VMM runs on; the VM must
	// not be used again in this process.
	Detach() (Handoff, []*os.File, error)
}

// Adopter is implemented by drivers that take over a VM that another
// process detached.
type Adopter interface {
	// Adopt takes over the VM of h, whose state directory is now
	// stateDir, with the files Detach returned (Adopt owns them). On
	// error the VMM is ended and reaped, whoever's child it is.
	Adopt(ctx context.Context, h Handoff, files []*os.File, stateDir string) (VM, error)
}
