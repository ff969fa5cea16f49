package qemu

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu/qmp"
)

// DefaultVhostNetDevice is the host device of vhost-net, the kernel's
// virtio-net data path.
const DefaultVhostNetDevice = "/dev/vhost-net"

const (
	// microvmTransports is how many virtio-mmio transports microvm has
	// without ACPI (the driver's acpi=off; only ACPI's second IOAPIC
	// brings 24). Every virtio device of the guest takes one, and a
	// device with none left fails QEMU's start.
	microvmTransports = 8
	// maxNICs bounds Spec.NICs whatever the machine: the ids are net0
	// to net15 at most. The machine's transports bound them further
	// (see checkTransports).
	maxNICs = 16
	// minMTU and maxMTU bound NIC.MTU: Linux's ETH_MIN_MTU (its
	// virtio-net driver ignores a smaller host MTU) and QEMU's 16-bit
	// host_mtu.
	minMTU = 68
	maxMTU = 65535
)

// nicIDPattern is the form of NIC.ID; validateNICs also wants them in
// order.
var nicIDPattern = regexp.MustCompile(`^net[0-9]{1,2}$`)

// nicFDs are the descriptor numbers one NIC's files have in QEMU.
type nicFDs struct {
	// tap is the tap device.
	tap int
	// vhost is the NIC's own /dev/vhost-net descriptor, 0 without
	// vhost.
	vhost int
}

// nicArgs are the arguments of one NIC: a tap netdev on a descriptor QEMU
// inherits, and the virtio-mmio virtio-net device on it.
//
// The tap comes as a descriptor, never as a name (ifname=) or a script:
// it lives in the sandbox's network namespace, which QEMU is not in, and
// QEMU opens nothing of the network itself (nor could it under -sandbox,
// which denies spawning the helper scripts), so what QEMU can reach of the
// network is exactly the taps it was handed.
//
// host_mtu offers the guest VIRTIO_NET_F_MTU, with the MTU in the
// device's config space: the guest's driver gives the interface that MTU
// when it probes the device, before anything in the guest runs, so the
// guest never sends frames larger than the tap's network takes (an
// overlay's 1450, say) and can use a larger one without being told some
// other way. Without MTU the guest keeps Linux's 1500. Whether the feature
// is offered belongs to the device a saved state needs: QEMU refuses to
// load a guest that negotiated it into a device without host_mtu (the
// value itself may differ). machineOf names the NIC only, so that refusal
// comes from QEMU's load, not from the machine check.
//
// vhost-net moves the data path out of QEMU's main loop into a kernel
// thread, which the guest kicks through ioeventfds. QEMU 7.2 has those
// only with KVM (it turns virtio-mmio's ioeventfd off without), so under
// TCG vhost-net would not start: QEMU would complain and fall back to its
// own virtio-net. A TCG guest is bound by its emulated CPU anyway, not by
// the data path. The driver asks for vhost only under KVM, and only when
// the device can be opened (see openVhostNet).
func nicArgs(n hypervisor.NIC, fds nicFDs) []string {
	netdev := fmt.Sprintf("tap,id=%s,fd=%d", n.ID, fds.tap)
	if fds.vhost > 0 {
		netdev += fmt.Sprintf(",vhost=on,vhostfd=%d", fds.vhost)
	}
	device := fmt.Sprintf("virtio-net-device,netdev=%s,mac=%s", n.ID, n.MAC)
	if n.MTU > 0 {
		device += ",host_mtu=" + strconv.Itoa(n.MTU)
	}
	return []string{"-netdev", netdev, "-device", device}
}

// inheritedFiles lays out the files QEMU inherits (exec.Cmd.ExtraFiles),
// which become its descriptors firstInheritedFD, firstInheritedFD+1, ...
// in order: the vsock device first (vhostFD; nil without vsock), then
// each NIC's tap followed by its vhost-net descriptor if vhostNet has one
// for it (vhostNet is nil or parallel to nics). It returns the files and
// the descriptor numbers of each NIC, which the command line names.
func inheritedFiles(vsock *os.File, nics []hypervisor.NIC, vhostNet []*os.File) ([]*os.File, []nicFDs) {
	var files []*os.File
	if vsock != nil {
		files = append(files, vsock) // at vhostFD
	}
	fds := make([]nicFDs, len(nics))
	for i, n := range nics {
		fds[i].tap = firstInheritedFD + len(files)
		files = append(files, n.Tap)
		if i < len(vhostNet) && vhostNet[i] != nil {
			fds[i].vhost = firstInheritedFD + len(files)
			files = append(files, vhostNet[i])
		}
	}
	return files, fds
}

// openVhostNet opens device (the vhost-net device) once per NIC of spec,
// for QEMU to inherit: each vhost-net descriptor serves one queue pair.
// It opens nothing when spec has no NICs or runs under TCG (see nicArgs).
// When the device cannot be opened it returns the reason and no files, and
// the NICs go without vhost: slower, but working. The caller closes the
// files once QEMU has started (QEMU holds its own copies) or failed to.
func openVhostNet(device string, spec hypervisor.Spec) ([]*os.File, error) {
	if len(spec.NICs) == 0 || spec.Accel != hypervisor.AccelKVM {
		return nil, nil
	}
	files := make([]*os.File, 0, len(spec.NICs))
	for range spec.NICs {
		f, err := os.OpenFile(device, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			closeFiles(files)
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// closeFiles closes the files that are not nil.
func closeFiles(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// validateNICs checks Spec.NICs: ids net0, net1, ... in order, an open
// tap each, a unicast MAC address, an MTU the guest and QEMU take.
func validateNICs(nics []hypervisor.NIC) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", errdefs.ErrInvalidArgument, fmt.Sprintf(format, a...))
	}
	if len(nics) > maxNICs {
		return bad("%d nics, more than the %d the driver names", len(nics), maxNICs)
	}
	seen := make(map[string]int, len(nics))
	for i, n := range nics {
		if !nicIDPattern.MatchString(n.ID) {
			return bad("nic %d: id %q is not net<N>", i, n.ID)
		}
		if j, ok := seen[n.ID]; ok {
			return bad("nics %d and %d are both %s", j, i, n.ID)
		}
		seen[n.ID] = i
		if want := "net" + strconv.Itoa(i); n.ID != want {
			return bad("nic %d is %s, want %s: nics are net0, net1, ... in order", i, n.ID, want)
		}
		if n.Tap == nil {
			return bad("nic %s: no tap", n.ID)
		}
		if err := checkOpen(n.Tap); err != nil {
			return bad("nic %s: tap: %v", n.ID, err)
		}
		if len(n.MAC) != 6 {
			return bad("nic %s: mac address %q is %d bytes, want 6", n.ID, n.MAC, len(n.MAC))
		}
		if n.MAC[0]&1 != 0 {
			return bad("nic %s: mac address %s is a multicast address", n.ID, n.MAC)
		}
		if bytes.Equal(n.MAC, make([]byte, 6)) {
			return bad("nic %s: mac address %s is all zeros", n.ID, n.MAC)
		}
		if n.MTU != 0 && (n.MTU < minMTU || n.MTU > maxMTU) {
			return bad("nic %s: mtu %d, want 0 (the default) or %d-%d", n.ID, n.MTU, minMTU, maxMTU)
		}
	}
	return nil
}

// checkOpen fails for a closed file, which exec would silently leave out
// of QEMU's descriptors. Unlike Fd it leaves the file's mode alone.
func checkOpen(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(uintptr) {})
}

// checkTransports fails when spec's guest has more virtio devices than
// microvm has virtio-mmio transports. Each device machineOf names is one.
func checkTransports(spec hypervisor.Spec) error {
	devices := len(machineOf(spec, qmp.Version{}).Devices)
	if devices <= microvmTransports {
		return nil
	}
	others := devices - len(spec.NICs)
	what := "rng, scsi controller and agent channel"
	if spec.Share != nil {
		what = "rng, scsi controller, agent channel and shared directory"
	}
	return fmt.Errorf("%w: %d nics: microvm has %d virtio-mmio transports and the guest's %s take %d, which leaves %d",
		errdefs.ErrInvalidArgument, len(spec.NICs), microvmTransports, what, others, microvmTransports-others)
}
