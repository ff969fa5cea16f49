package qemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu/qmp"
)

// testFile is an open file standing in for a tap or a device.
func testFile(t *testing.T, dir, name string) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func testMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, byte(0x56 + i)}
}

// testNICs are n valid NICs on stand-in taps, with the given MTUs (0 where
// mtus runs out).
func testNICs(t *testing.T, n int, mtus ...int) []hypervisor.NIC {
	t.Helper()
	dir := t.TempDir()
	nics := make([]hypervisor.NIC, n)
	for i := range nics {
		nics[i] = hypervisor.NIC{ID: fmt.Sprintf("net%d", i), Tap: testFile(t, dir, fmt.Sprintf("tap%d", i)), MAC: testMAC(i)}
		if i < len(mtus) {
			nics[i].MTU = mtus[i]
		}
	}
	return nics
}

// nicParams are the launch parameters of spec as Launch lays out its
// descriptors, with vhost-net for every NIC if vhost.
func nicParams(t *testing.T, spec hypervisor.Spec, vhost bool) launchParams {
	t.Helper()
	dir := t.TempDir()
	var vsock *os.File
	if spec.Channel == channel.Vsock {
		vsock = testFile(t, dir, "vhost-vsock")
	}
	var vhostNet []*os.File
	if vhost {
		for i := range spec.NICs {
			vhostNet = append(vhostNet, testFile(t, dir, fmt.Sprintf("vhost-net%d", i)))
		}
	}
	_, fds := inheritedFiles(vsock, spec.NICs, vhostNet)
	return launchParams{spec: spec, tbSizeMiB: 20, tscKHz: 2596094, cid: 7, nics: fds}
}

// TestCommandLineNICs checks the NIC arguments: after every other device
// (the command line without NICs is left as it was), descriptors after
// the vsock one, vhost only when given, host_mtu only with an MTU.
func TestCommandLineNICs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		accel hypervisor.Accel
		ch    channel.Kind
		nics  int
		mtus  []int
		vhost bool
		want  []string // the arguments the NICs add, at the end
	}{{
		name: "none", accel: hypervisor.AccelTCG, ch: channel.Serial,
	}, {
		name: "one on serial", accel: hypervisor.AccelTCG, ch: channel.Serial, nics: 1,
		want: []string{
			"-netdev", "tap,id=net0,fd=3",
			"-device", "virtio-net-device,netdev=net0,mac=52:54:00:12:34:56",
		},
	}, {
		name: "one with an mtu", accel: hypervisor.AccelKVM, ch: channel.Serial, nics: 1, mtus: []int{1450},
		want: []string{
			"-netdev", "tap,id=net0,fd=3",
			"-device", "virtio-net-device,netdev=net0,mac=52:54:00:12:34:56,host_mtu=1450",
		},
	}, {
		name: "two after the vsock descriptor", accel: hypervisor.AccelTCG, ch: channel.Vsock, nics: 2, mtus: []int{0, 9000},
		want: []string{
			"-netdev", "tap,id=net0,fd=4",
			"-device", "virtio-net-device,netdev=net0,mac=52:54:00:12:34:56",
			"-netdev", "tap,id=net1,fd=5",
			"-device", "virtio-net-device,netdev=net1,mac=52:54:00:12:34:57,host_mtu=9000",
		},
	}, {
		name: "two with vhost on vsock", accel: hypervisor.AccelKVM, ch: channel.Vsock, nics: 2, mtus: []int{1500}, vhost: true,
		want: []string{
			"-netdev", "tap,id=net0,fd=4,vhost=on,vhostfd=5",
			"-device", "virtio-net-device,netdev=net0,mac=52:54:00:12:34:56,host_mtu=1500",
			"-netdev", "tap,id=net1,fd=6,vhost=on,vhostfd=7",
			"-device", "virtio-net-device,netdev=net1,mac=52:54:00:12:34:57",
		},
	}, {
		name: "two with vhost on serial", accel: hypervisor.AccelKVM, ch: channel.Serial, nics: 2, vhost: true,
		want: []string{
			"-netdev", "tap,id=net0,fd=3,vhost=on,vhostfd=4",
			"-device", "virtio-net-device,netdev=net0,mac=52:54:00:12:34:56",
			"-netdev", "tap,id=net1,fd=5,vhost=on,vhostfd=6",
			"-device", "virtio-net-device,netdev=net1,mac=52:54:00:12:34:57",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			base := testSpec(tc.accel, tc.ch)
			without := commandLine(nicParams(t, base, false))
			spec := base
			spec.NICs = testNICs(t, tc.nics, tc.mtus...)
			got := commandLine(nicParams(t, spec, tc.vhost))
			if want := append(slices.Clone(without), tc.want...); !slices.Equal(got, want) {
				t.Errorf("command line:\n got %q\nwant %q", got, want)
			}
			for _, a := range got {
				if tc.nics == 0 && (a == "-netdev" || strings.Contains(a, "virtio-net")) {
					t.Errorf("argument %q without NICs", a)
				}
			}
		})
	}
}

// TestCommandLineRestoreNICs: a restore has the boot's NICs, on the taps
// it is given, before QEMU waits for the state.
func TestCommandLineRestoreNICs(t *testing.T) {
	spec := testSpec(hypervisor.AccelKVM, channel.Vsock)
	spec.NICs = testNICs(t, 2, 1500)
	boot := commandLine(nicParams(t, spec, true))
	spec.Restore = &hypervisor.Restore{State: os.Stdin}
	got := commandLine(nicParams(t, spec, true))
	want := append(slices.Clone(boot), "-S", "-incoming", "defer")
	if !slices.Equal(got, want) {
		t.Errorf("restore command line:\n got %q\nwant %q", got, want)
	}
}

// TestInheritedFiles checks that each file lands at the descriptor number
// the command line names: ExtraFiles[i] is descriptor 3+i in QEMU.
func TestInheritedFiles(t *testing.T) {
	dir := t.TempDir()
	vsock := testFile(t, dir, "vsock")
	nics := testNICs(t, 3)
	vhost := []*os.File{testFile(t, dir, "vhost0"), nil, testFile(t, dir, "vhost2")}
	at := func(files []*os.File, fd int) *os.File {
		if i := fd - firstInheritedFD; fd > 0 && i < len(files) {
			return files[i]
		}
		return nil
	}
	for _, tc := range []struct {
		name  string
		vsock *os.File
		vhost []*os.File
		want  []nicFDs
	}{
		{"vsock and vhost", vsock, vhost, []nicFDs{{4, 5}, {6, 0}, {7, 8}}},
		{"vhost only", nil, vhost, []nicFDs{{3, 4}, {5, 0}, {6, 7}}},
		{"vsock only", vsock, nil, []nicFDs{{4, 0}, {5, 0}, {6, 0}}},
		{"neither", nil, nil, []nicFDs{{3, 0}, {4, 0}, {5, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, fds := inheritedFiles(tc.vsock, nics, tc.vhost)
			if !slices.Equal(fds, tc.want) {
				t.Fatalf("descriptors %v, want %v", fds, tc.want)
			}
			n := len(nics)
			if tc.vsock != nil {
				n++
				if at(files, vhostFD) != tc.vsock {
					t.Errorf("descriptor %d is not the vsock device", vhostFD)
				}
			}
			for i, nic := range nics {
				if at(files, fds[i].tap) != nic.Tap {
					t.Errorf("%s: descriptor %d is not its tap", nic.ID, fds[i].tap)
				}
				if tc.vhost != nil && tc.vhost[i] != nil {
					n++
					if at(files, fds[i].vhost) != tc.vhost[i] {
						t.Errorf("%s: descriptor %d is not its vhost-net", nic.ID, fds[i].vhost)
					}
				}
			}
			if len(files) != n {
				t.Errorf("%d files passed, want %d", len(files), n)
			}
		})
	}
}

func TestOpenVhostNet(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "vhost-net")
	if err := os.WriteFile(dev, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	spec := testSpec(hypervisor.AccelKVM, channel.Serial)
	spec.NICs = testNICs(t, 2)

	files, err := openVhostNet(dev, spec)
	if err != nil || len(files) != 2 || files[0] == nil || files[1] == nil || files[0].Fd() == files[1].Fd() {
		t.Fatalf("kvm: %v, %v; want a descriptor of its own per nic", files, err)
	}
	closeFiles(files)

	tcg := spec
	tcg.Accel = hypervisor.AccelTCG
	if files, err := openVhostNet(dev, tcg); files != nil || err != nil {
		t.Errorf("tcg: %v, %v; want no vhost", files, err)
	}
	none := testSpec(hypervisor.AccelKVM, channel.Serial)
	if files, err := openVhostNet(dev, none); files != nil || err != nil {
		t.Errorf("no nics: %v, %v; want nothing", files, err)
	}
	if files, err := openVhostNet(filepath.Join(t.TempDir(), "gone"), spec); files != nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("no device: %v, %v; want no files and the reason", files, err)
	}
	if _, err := os.Stat(DefaultVhostNetDevice); err != nil {
		// This host: the real device is missing, and the NICs go
		// without vhost.
		if files, err := openVhostNet(DefaultVhostNetDevice, spec); files != nil || err == nil {
			t.Errorf("%s: %v, %v", DefaultVhostNetDevice, files, err)
		}
	}
	if New(Config{}).vhostNet != DefaultVhostNetDevice {
		t.Errorf("the driver's vhost-net device is %q", New(Config{}).vhostNet)
	}
}

func TestValidateNICs(t *testing.T) {
	if err := validateNICs(nil); err != nil {
		t.Fatalf("no nics: %v", err)
	}
	good := testNICs(t, 3, 1500, 68, 65535)
	if err := validateNICs(good); err != nil {
		t.Fatalf("good nics: %v", err)
	}
	closed := testNICs(t, 1)
	closed[0].Tap.Close()
	for _, tc := range []struct {
		name   string
		mutate func([]hypervisor.NIC) []hypervisor.NIC
		want   string
	}{
		{"bad id", func(n []hypervisor.NIC) []hypervisor.NIC { n[1].ID = "eth1"; return n }, `nic 1: id "eth1" is not net<N>`},
		{"empty id", func(n []hypervisor.NIC) []hypervisor.NIC { n[0].ID = ""; return n }, `nic 0: id "" is not net<N>`},
		{"three digits", func(n []hypervisor.NIC) []hypervisor.NIC { n[0].ID = "net000"; return n }, "is not net<N>"},
		{"option syntax", func(n []hypervisor.NIC) []hypervisor.NIC { n[0].ID = "net0,fd=0"; return n }, "is not net<N>"},
		{"duplicate", func(n []hypervisor.NIC) []hypervisor.NIC { n[1].ID = "net0"; return n }, "nics 0 and 1 are both net0"},
		{"out of order", func(n []hypervisor.NIC) []hypervisor.NIC { n[0].ID, n[1].ID = "net1", "net0"; return n }, "nic 0 is net1, want net0"},
		{"gap", func(n []hypervisor.NIC) []hypervisor.NIC { n[2].ID = "net3"; return n }, "nic 2 is net3, want net2"},
		{"leading zero", func(n []hypervisor.NIC) []hypervisor.NIC { n[0].ID = "net00"; return n }, "nic 0 is net00, want net0"},
		{"no tap", func(n []hypervisor.NIC) []hypervisor.NIC { n[1].Tap = nil; return n }, "nic net1: no tap"},
		{"closed tap", func(n []hypervisor.NIC) []hypervisor.NIC { n[1].Tap = closed[0].Tap; return n }, "nic net1: tap:"},
		{"no mac", func(n []hypervisor.NIC) []hypervisor.NIC { n[2].MAC = nil; return n }, "nic net2: mac address \"\" is 0 bytes, want 6"},
		{"long mac", func(n []hypervisor.NIC) []hypervisor.NIC {
			n[0].MAC = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0, 0, 1}
			return n
		}, "nic net0: mac address \"52:54:00:00:00:00:00:01\" is 8 bytes"},
		{"multicast mac", func(n []hypervisor.NIC) []hypervisor.NIC {
			n[0].MAC = net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}
			return n
		}, "nic net0: mac address 01:00:5e:00:00:01 is a multicast address"},
		{"broadcast mac", func(n []hypervisor.NIC) []hypervisor.NIC {
			n[0].MAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
			return n
		}, "multicast"},
		{"zero mac", func(n []hypervisor.NIC) []hypervisor.NIC { n[0].MAC = make(net.HardwareAddr, 6); return n }, "nic net0: mac address 00:00:00:00:00:00 is all zeros"},
		{"tiny mtu", func(n []hypervisor.NIC) []hypervisor.NIC { n[1].MTU = 67; return n }, "nic net1: mtu 67, want 0 (the default) or 68-65535"},
		{"huge mtu", func(n []hypervisor.NIC) []hypervisor.NIC { n[1].MTU = 65536; return n }, "nic net1: mtu 65536"},
		{"negative mtu", func(n []hypervisor.NIC) []hypervisor.NIC { n[1].MTU = -1; return n }, "nic net1: mtu -1"},
		{"too many", func([]hypervisor.NIC) []hypervisor.NIC { return testNICs(t, 17) }, "17 nics, more than the 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validateNICs(tc.mutate(slices.Clone(good)))
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalidArgument mentioning %q", err, tc.want)
			}
		})
	}
}

// TestValidateSpecNICs: validateSpec checks the NICs, that they fit
// microvm's transports, and counts microvm's additions to the kernel
// command line.
func TestValidateSpecNICs(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinux")
	os.WriteFile(kernel, append([]byte("\x7fELF"), make([]byte, 100)...), 0o644)
	good := hypervisor.Spec{ID: "x", StateDir: dir, Kernel: kernel, VCPUs: 1, MemoryMiB: 256,
		Accel: hypervisor.AccelKVM, Channel: channel.Vsock, NICs: testNICs(t, 5, 1500)}
	if err := validateSpec(good); err != nil {
		t.Fatalf("five nics: %v", err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*hypervisor.Spec)
		want   string
	}{
		{"bad nic", func(s *hypervisor.Spec) { s.NICs[4].MTU = 10 }, "nic net4: mtu 10"},
		{"six nics", func(s *hypervisor.Spec) { s.NICs = testNICs(t, 6) }, "6 nics: microvm has 8 virtio-mmio transports and the guest's rng, scsi controller and agent channel take 3, which leaves 5"},
		{"six nics on serial", func(s *hypervisor.Spec) { s.Channel = channel.Serial; s.NICs = testNICs(t, 6) }, "which leaves 5"},
		{"cmdline with the virtio entries", func(s *hypervisor.Spec) {
			// Fits alone, not with microvm's eight entries.
			s.KernelArgs = []string{strings.Repeat("x", 2047-len("console=ttyS0 reboot=t panic=-1 cocoon.channel=vsock ")-10)}
		}, "kernel command line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good
			s.NICs = slices.Clone(good.NICs)
			tc.mutate(&s)
			err := validateSpec(s)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalidArgument mentioning %q", err, tc.want)
			}
		})
	}
	// The bound of the command line with its entries: exactly 2047 is
	// taken, one more refused.
	s := good
	s.NICs = nil
	fixed := len(kernelCmdline(launchParams{spec: s})) + 1 + 3*mmioCmdlineBytes
	s.KernelArgs = []string{strings.Repeat("x", 2047-fixed)}
	if err := validateSpec(s); err != nil {
		t.Errorf("2047 bytes with the entries: %v", err)
	}
	s.KernelArgs = []string{strings.Repeat("x", 2048-fixed)}
	if err := validateSpec(s); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("2048 bytes with the entries: %v", err)
	}
}

// TestMachineOfNICs: the NICs follow the devices every guest has, and a
// guest without NICs keeps exactly the list it had before NICs existed
// (template keys and checkpoints depend on it).
func TestMachineOfNICs(t *testing.T) {
	v := qmp.Version{}
	for ch, before := range map[channel.Kind][]string{
		channel.Serial: {"virtio-rng", "virtio-scsi:scsi0", "agent:virtio-serial"},
		channel.Vsock:  {"virtio-rng", "virtio-scsi:scsi0", "agent:vhost-vsock"},
	} {
		spec := testSpec(hypervisor.AccelKVM, ch)
		if got := machineOf(spec, v).Devices; !slices.Equal(got, before) {
			t.Errorf("%s without nics: %q, want %q", ch, got, before)
		}
		spec.NICs = []hypervisor.NIC{}
		if got := machineOf(spec, v).Devices; !slices.Equal(got, before) {
			t.Errorf("%s with an empty nic list: %q, want %q", ch, got, before)
		}
		// The taps, MACs and MTUs are the backends' and the guest's
		// configuration, not the machine: only the ids count.
		spec.NICs = []hypervisor.NIC{{ID: "net0"}, {ID: "net1", MTU: 9000}}
		want := append(slices.Clone(before), "virtio-net:net0", "virtio-net:net1")
		if got := machineOf(spec, v).Devices; !slices.Equal(got, want) {
			t.Errorf("%s with two nics: %q, want %q", ch, got, want)
		}
	}
}

func TestPlanNICs(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip(err)
	}
	d := New(Config{Binary: sh})
	spec := testSpec(hypervisor.AccelKVM, channel.Serial)
	spec.NICs = []hypervisor.NIC{{ID: "net0"}}
	p, err := d.Plan(spec)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"virtio-rng", "virtio-scsi:scsi0", "agent:virtio-serial", "virtio-net:net0"}; !slices.Equal(p.Devices, want) {
		t.Errorf("plan devices %q, want %q", p.Devices, want)
	}
}

// fakeQEMU writes an executable that records its arguments and where its
// descriptors 3-9 lead into out, then fails as a QEMU that cannot start.
// It opens nothing while it looks (no pipe of a $(...)), so that the
// descriptors it reads are the inherited ones.
func fakeQEMU(t *testing.T, out string) string {
	t.Helper()
	readlink, err := exec.LookPath("readlink")
	if err != nil {
		t.Skip(err)
	}
	script := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	body := fmt.Sprintf(`#!/bin/sh
for a in "$@"; do printf '%%s\n' "$a"; done > %[1]s/args
for fd in 3 4 5 6 7 8 9; do echo "fd $fd"; %[2]s /proc/$$/fd/$fd; done > %[1]s/fds
echo "fake qemu: not starting" >&2
exit 1
`, out, readlink)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}

// realPath is path with its symbolic links resolved, as /proc names it.
func realPath(t *testing.T, path string) string {
	t.Helper()
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// openDescriptorsOf counts this process's descriptors open on path.
func openDescriptorsOf(t *testing.T, path string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == path {
			n++
		}
	}
	return n
}

// TestLaunchPassesNICs launches a stand-in for QEMU and checks that the
// descriptors the NIC arguments name are the taps and vhost-net devices,
// that the driver closes the vhost-net descriptors it opened and leaves
// the caller's taps open.
func TestLaunchPassesNICs(t *testing.T) {
	for _, tc := range []struct {
		accel hypervisor.Accel
		want  []string // the NIC arguments
		fds   []string // what descriptors 3-9 lead to: tap0, tap1, vhost, or nothing
	}{{
		accel: hypervisor.AccelKVM,
		want: []string{
			"-netdev", "tap,id=net0,fd=3,vhost=on,vhostfd=4",
			"-device", "virtio-net-device,netdev=net0,mac=52:54:00:12:34:56,host_mtu=1500",
			"-netdev", "tap,id=net1,fd=5,vhost=on,vhostfd=6",
			"-device", "virtio-net-device,netdev=net1,mac=52:54:00:12:34:57",
		},
		fds: []string{"tap0", "vhost", "tap1", "vhost", "", "", ""},
	}, {
		accel: hypervisor.AccelTCG,
		want: []string{
			"-netdev", "tap,id=net0,fd=3",
			"-device", "virtio-net-device,netdev=net0,mac=52:54:00:12:34:56,host_mtu=1500",
			"-netdev", "tap,id=net1,fd=4",
			"-device", "virtio-net-device,netdev=net1,mac=52:54:00:12:34:57",
		},
		fds: []string{"tap0", "tap1", "", "", "", "", ""},
	}} {
		t.Run(string(tc.accel), func(t *testing.T) {
			out := t.TempDir()
			devDir := t.TempDir()
			vhostDev := filepath.Join(devDir, "vhost-net")
			os.WriteFile(vhostDev, nil, 0o600)
			kernel := filepath.Join(devDir, "vmlinux")
			os.WriteFile(kernel, append([]byte("\x7fELF"), make([]byte, 100)...), 0o644)

			d := New(Config{Binary: fakeQEMU(t, out)})
			d.vhostNet = vhostDev
			spec := baseSpec(t, kernel)
			spec.Accel = tc.accel
			spec.NICs = testNICs(t, 2, 1500)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := launchExpectError(t, ctx, d, spec)
			if !strings.Contains(err.Error(), "fake qemu: not starting") {
				t.Fatalf("err = %v, want the stand-in's exit", err)
			}

			data, err := os.ReadFile(filepath.Join(out, "args"))
			if err != nil {
				t.Fatal(err)
			}
			args := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
			if len(args) < len(tc.want) || !slices.Equal(args[len(args)-len(tc.want):], tc.want) {
				t.Errorf("arguments end %q, want %q", args, tc.want)
			}
			data, err = os.ReadFile(filepath.Join(out, "fds"))
			if err != nil {
				t.Fatal(err)
			}
			names := map[string]string{realPath(t, vhostDev): "vhost", realPath(t, spec.NICs[0].Tap.Name()): "tap0", realPath(t, spec.NICs[1].Tap.Name()): "tap1"}
			// "fd <n>" lines, each followed by where n leads if it is open.
			var got []string
			for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
				if strings.HasPrefix(line, "fd ") {
					got = append(got, "")
				} else if len(got) > 0 {
					if name, ok := names[line]; ok {
						line = name
					}
					got[len(got)-1] = line
				}
			}
			if !slices.Equal(got, tc.fds) {
				t.Errorf("descriptors 3-9 lead to %q, want %q", got, tc.fds)
			}

			if n := openDescriptorsOf(t, realPath(t, vhostDev)); n != 0 {
				t.Errorf("%d vhost-net descriptors left open", n)
			}
			for _, n := range spec.NICs {
				if err := checkOpen(n.Tap); err != nil {
					t.Errorf("%s: the caller's tap was closed: %v", n.ID, err)
				}
			}
			assertLeftOnly(t, spec.StateDir)
		})
	}
}
