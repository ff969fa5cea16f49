package qemu

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

// Names of the files the driver keeps in Spec.StateDir.
const (
	// QMPSocketName is QEMU's control socket.
	QMPSocketName = "qmp.sock"
	// AgentSocketName is the host end of the agent's virtio-serial port
	// (serial channel only).
	AgentSocketName = "agent.sock"
	// PIDFileName holds QEMU's pid, for Cleanup after a crashed shim.
	PIDFileName = "qemu.pid"
	// ConsoleLogName is the guest console, capped at Spec.ConsoleLogBytes.
	// Stop keeps it for post-mortems; the state dir's owner removes it.
	ConsoleLogName = "console.log"
	// NameFileName holds QEMU's -name when it is not the state dir's own:
	// a QEMU adopted from a spare was launched in the spare's directory
	// and is known by that name (handoff.go).
	NameFileName = "qemu.name"
)

// AgentPortID is the QEMU device id of the agent's virtio-serial port in a
// restored VM, as named in its VSERPORT_CHANGE events.
const AgentPortID = "agent-port"

// SCSIControllerID is the id of the virtio-scsi controller created at boot.
// microvm's virtio-mmio devices cannot be hot-plugged, so disks that arrive
// later go onto this controller: device_add scsi-hd,bus=<id>.0.
const SCSIControllerID = "scsi0"

// DefaultTBSizeMiB is TCG's translation-block cache size. QEMU 7.2's own
// default (up to 1 GiB, filled as the guest runs) would dwarf the guest.
// Measured here (256 MiB guest, a Go workload run five times): 16 MiB
// thrashes (warm runs 2-3x slower), 20-48 MiB perform alike. QEMU's
// anonymous memory outside guest RAM is this cache plus ~17 MiB of its own
// state plus a copy of the initrd it keeps for reset: 37 MiB at 20 MiB with
// a 1 MiB initrd, 42 MiB at 24, 50 MiB at 32. 20 keeps a sandbox within the
// 40 MiB budget.
const DefaultTBSizeMiB = 20

// tcgCPUModel is the CPU model under TCG: qemu64 boots fastest (max is ~30%
// slower to boot), and the x86-64-v2 extensions on top cost nothing
// measurable while letting images built for x86-64-v2 (RHEL 9 and its
// rebuilds) run.
const tcgCPUModel = "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt"

// sandboxArg confines QEMU with seccomp: no obsolete syscalls, no setuid,
// no fork/exec, no scheduler/affinity changes. All four are accepted by
// Debian's QEMU 7.2 and boot the guest unchanged.
const sandboxArg = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// firstInheritedFD is the descriptor number in QEMU of the first of
// exec.Cmd.ExtraFiles; the others follow (see inheritedFiles).
const firstInheritedFD = 3

// vhostFD is the descriptor number of /dev/vhost-vsock in QEMU: the first
// of exec.Cmd.ExtraFiles.
const vhostFD = firstInheritedFD

// launchParams is everything the command line depends on, so that it can be
// built, and tested, without touching the host.
type launchParams struct {
	spec      hypervisor.Spec
	tbSizeMiB int
	// tscKHz is the host TSC frequency handed to a TCG guest; 0 leaves it
	// out.
	tscKHz uint64
	// cid is the reserved vsock context id (vsock only). Its reservation
	// is passed to QEMU as descriptor vhostFD.
	cid uint32
	// nics are the descriptor numbers of Spec.NICs' files in QEMU, one
	// per NIC in the same order (inheritedFiles).
	nics []nicFDs
}

func (p launchParams) path(name string) string { return filepath.Join(p.spec.StateDir, name) }

// QEMU runs in the state dir (its working directory) and binds its sockets
// there by name: the state dir's path holds the namespace and the sandbox
// id, and may be longer than the 107 bytes of a sockaddr_un. The host
// reaches them with channel.DialUnix.
const (
	qmpChardev   = "socket,id=qmp,path=" + QMPSocketName + ",server=on,wait=off"
	agentChardev = "socket,id=agent,path=" + AgentSocketName + ",server=on,wait=off"
)

// nameArg is QEMU's -name: the VM is named after its state dir, which
// makes it unique on the host. Cleanup looks for it in
// /proc/<pid>/cmdline to recognize the QEMU of a state dir.
func nameArg(stateDir string) string {
	return "guest=" + optValue(stateDir)
}

// memoryBackendID names the memory backend of guest RAM. QEMU names the
// RAM block after it: a saved state loads only into a VM whose RAM has
// the same id, so it is fixed.
const memoryBackendID = "mem"

// commandLine builds QEMU's arguments (without argv[0]).
func commandLine(p launchParams) []string {
	s := p.spec
	machine := []string{
		"microvm",
		// No option ROMs: the kernel is booted directly (qboot/PVH).
		"x-option-roms=off",
		// The RTC stays: without it the kernel spends ~2 s timing out
		// on it and the guest starts with no wall clock. PIT and PIC
		// stay at microvm's defaults: turning them off saved nothing
		// measurable under TCG.
		"rtc=on",
		// No ACPI: the guest kernel is built without it, and without
		// ACPI QEMU lists the virtio-mmio devices on the kernel command
		// line (virtio_mmio.device=...), which is how the guest finds
		// them. It also spares the guest parsing ACPI tables at boot.
		"acpi=off",
	}
	// Guest RAM is always a named backend, so that every saved state
	// has the same RAM block ("mem") whatever backs it: a checkpoint of a
	// clone (RAM in a private file mapping) restores into anonymous RAM.
	machine = append(machine, "memory-backend="+memoryBackendID)
	args := []string{
		"-M", strings.Join(machine, ","),
	}
	switch m := s.Memory; {
	case m != nil:
		share := "off"
		if m.Shared {
			share = "on"
		}
		// readonly stays off even for a clone: its private mapping
		// must be writable, and MAP_PRIVATE never writes the file.
		args = append(args, "-object", fmt.Sprintf("memory-backend-file,id=%s,size=%dM,mem-path=%s,share=%s",
			memoryBackendID, s.MemoryMiB, optValue(m.Path), share))
	case s.Share != nil:
		// virtiofsd reads and writes the guest's buffers in place:
		// vhost-user hands it guest RAM as descriptors to map, which
		// needs RAM in a shareable memfd rather than anonymous memory.
		args = append(args, "-object", fmt.Sprintf("memory-backend-memfd,id=%s,size=%dM,share=on", memoryBackendID, s.MemoryMiB))
	default:
		args = append(args, "-object", fmt.Sprintf("memory-backend-ram,id=%s,size=%dM", memoryBackendID, s.MemoryMiB))
	}
	if s.Share != nil {
		// microvm's virtio-mmio transports are legacy (virtio 0.9.5)
		// by default, and virtiofsd (libvhost-user) serves virtio 1.0
		// devices only: "virtio legacy devices aren't supported by
		// libvhost-user", and the guest's requests hang. The setting
		// is the transports', so every device of the guest is a
		// virtio 1.0 one then; a guest without a share keeps the
		// machine its saved states were made on.
		args = append(args, "-global", "virtio-mmio.force-legacy=false")
	}
	switch s.Accel {
	case hypervisor.AccelKVM:
		args = append(args, "-accel", "kvm", "-cpu", "host")
	default:
		args = append(args, "-accel", "tcg,tb-size="+strconv.Itoa(p.tbSizeMiB), "-cpu", tcgCPUModel)
	}
	args = append(args,
		"-m", strconv.Itoa(s.MemoryMiB)+"M",
		"-smp", strconv.Itoa(s.VCPUs),
		"-nodefaults", "-no-user-config", "-nographic",
		// A guest reboot ends QEMU: panic=-1 and reboot=t turn a guest
		// panic into a reset, and so into an exit the host sees.
		"-no-reboot",
		"-sandbox", sandboxArg,
		"-name", nameArg(s.StateDir),
		"-chardev", qmpChardev,
		"-mon", "chardev=qmp,mode=control",
		// The serial console goes to QEMU's stdout, a pipe the driver
		// drains into a ring and console.log. A pipe loses nothing
		// written before the host attaches; QEMU ignores SIGPIPE, so a
		// crashed shim does not take the guest down with it.
		"-chardev", "stdio,id=console,signal=off",
		"-serial", "chardev:console",
		"-kernel", s.Kernel,
	)
	if s.Initrd != "" {
		args = append(args, "-initrd", s.Initrd)
	}
	args = append(args,
		"-append", kernelCmdline(p),
		"-device", "virtio-rng-device",
		"-device", "virtio-scsi-device,id="+SCSIControllerID,
	)
	switch s.Channel {
	case channel.Vsock:
		// microvm has no PCI: the virtio-mmio flavour of vhost-vsock.
		// The CID is already reserved on the descriptor QEMU inherits.
		args = append(args, "-device", fmt.Sprintf("vhost-vsock-device,guest-cid=%d,vhostfd=%d", p.cid, vhostFD))
	default:
		port := "virtserialport,chardev=agent,name=" + channel.SerialPortName
		if s.Restore != nil {
			// With an id QEMU reports the guest opening and closing
			// the port (VSERPORT_CHANGE), which tells the host when
			// the restored guest has let go of the session it had
			// when saved. The id is not part of the saved state.
			port += ",id=" + AgentPortID
		}
		args = append(args,
			"-device", "virtio-serial-device",
			"-chardev", agentChardev,
			"-device", port,
		)
	}
	// The share, then the NICs (see nicArgs), come after every other
	// device: microvm hands out virtio-mmio transports in the order of
	// -device, so the other devices keep the transports they had before
	// there were shares and NICs, where the states saved then expect
	// them.
	if sh := s.Share; sh != nil {
		args = append(args, shareArgs(*sh)...)
	}
	for i, n := range s.NICs {
		args = append(args, nicArgs(n, p.nics[i])...)
	}
	if s.Restore != nil {
		// The same machine, waiting for a saved state instead of
		// running the kernel: "defer" lets the driver re-add the hot-
		// plugged disks and pass the state's descriptor over QMP
		// first. -S keeps the guest paused once the state is in, so
		// the driver, not QEMU, decides when it runs.
		args = append(args, "-S", "-incoming", "defer")
	}
	return args
}

// kernelCmdline is the guest kernel command line: the driver's own
// parameters, then Spec.KernelArgs (later parameters win where the kernel
// takes the last value). The driver's own are:
//
//	console=ttyS0          the serial console the host captures
//	reboot=t               reboot by triple fault: the quickest way out
//	panic=-1               reboot at once on panic, which -no-reboot turns into a QEMU exit
//	cocoon.channel=<kind>  the agent transport: serial or vsock
//
// and under TCG, where every calibration the kernel does against emulated
// timers costs real time (guest/image/README.md has the measurements):
//
//	tsc_early_khz=<kHz>    the host TSC rate (see hostTSCKHz): nothing in
//	                       microvm tells the guest, which otherwise hangs
//	lpj=<kHz*1000/HZ>      skips delay-loop calibration (Spec.KernelHZ)
//	noapictimer            no 200 ms APIC timer calibration against the PIT
//	tsc=reliable           no TSC watchdog or sync test (TCG's TSC is the host's)
//	noreplace-smp          no patching of every lock prefix on one vCPU
func kernelCmdline(p launchParams) string {
	args := []string{"console=ttyS0", "reboot=t", "panic=-1"}
	if p.spec.Accel != hypervisor.AccelKVM && p.tscKHz > 0 {
		args = append(args, "tsc_early_khz="+strconv.FormatUint(p.tscKHz, 10))
		if p.spec.KernelHZ > 0 {
			args = append(args, "lpj="+strconv.FormatUint(p.tscKHz*1000/uint64(p.spec.KernelHZ), 10))
		}
		args = append(args, "noapictimer", "tsc=reliable", "noreplace-smp")
	}
	args = append(args, "cocoon.channel="+string(p.spec.Channel))
	args = append(args, p.spec.KernelArgs...)
	return strings.Join(args, " ")
}

// mmioCmdlineBytes bounds what microvm (without ACPI) appends to the
// kernel command line for each virtio device, which is how the guest finds
// it: " virtio_mmio.device=512@<transport>:<irq>", with the transports at
// 0xfeb00000-0xfeb00e00 on irqs 5-12.
const mmioCmdlineBytes = len(" virtio_mmio.device=512@0xfeb00e00:12")

// optValue escapes a value for QEMU's key=value,... option syntax, where a
// comma is written twice.
func optValue(v string) string {
	return strings.ReplaceAll(v, ",", ",,")
}
