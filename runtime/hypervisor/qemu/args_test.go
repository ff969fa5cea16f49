package qemu

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

func testSpec(accel hypervisor.Accel, ch channel.Kind) hypervisor.Spec {
	return hypervisor.Spec{
		ID:         "sb1",
		StateDir:   "/run/cocoon/default/sb1",
		Kernel:     "/usr/local/share/cocoon/vmlinux",
		Initrd:     "/usr/local/share/cocoon/initrd.img",
		KernelArgs: []string{"quiet", "cocoon.debug=1"},
		VCPUs:      2,
		MemoryMiB:  256,
		Accel:      accel,
		Channel:    ch,
		KernelHZ:   100,
	}
}

// TestCommandLineSerialTCG pins the whole command line of the common case
// here, so that any change to it is deliberate.
func TestCommandLineSerialTCG(t *testing.T) {
	got := commandLine(launchParams{spec: testSpec(hypervisor.AccelTCG, channel.Serial), tbSizeMiB: 20, tscKHz: 2596094})
	want := []string{
		"-M", "microvm,x-option-roms=off,rtc=on,acpi=off,memory-backend=mem",
		"-object", "memory-backend-ram,id=mem,size=256M",
		"-accel", "tcg,tb-size=20",
		"-cpu", "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt",
		"-m", "256M",
		"-smp", "2",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-name", "guest=/run/cocoon/default/sb1",
		"-chardev", "socket,id=qmp,path=qmp.sock,server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
		"-chardev", "stdio,id=console,signal=off",
		"-serial", "chardev:console",
		"-kernel", "/usr/local/share/cocoon/vmlinux",
		"-initrd", "/usr/local/share/cocoon/initrd.img",
		"-append", "console=ttyS0 reboot=t panic=-1 tsc_early_khz=2596094 lpj=25960940 noapictimer tsc=reliable noreplace-smp cocoon.channel=serial quiet cocoon.debug=1",
		"-device", "virtio-rng-device",
		"-device", "virtio-scsi-device,id=scsi0",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path=agent.sock,server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=io.cocoon.agent.0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("command line:\n got %q\nwant %q", got, want)
	}
}

func TestCommandLineVariants(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p       launchParams
		want    []string // consecutive argument pairs that must appear
		wantNot []string // substrings no argument may contain
	}{{
		name: "kvm uses the host cpu and no tsc hint",
		p:    launchParams{spec: testSpec(hypervisor.AccelKVM, channel.Serial), tbSizeMiB: 24, tscKHz: 2596094},
		want: []string{
			"-accel", "kvm",
			"-cpu", "host",
			"-append", "console=ttyS0 reboot=t panic=-1 cocoon.channel=serial quiet cocoon.debug=1",
		},
		wantNot: []string{"tb-size", "tsc_early_khz", "qemu64"},
	}, {
		name: "vsock passes the reserved cid and descriptor",
		p:    launchParams{spec: testSpec(hypervisor.AccelTCG, channel.Vsock), tbSizeMiB: 32, tscKHz: 1000000, cid: 4242},
		want: []string{
			"-accel", "tcg,tb-size=32",
			"-device", "vhost-vsock-device,guest-cid=4242,vhostfd=3",
			"-append", "console=ttyS0 reboot=t panic=-1 tsc_early_khz=1000000 lpj=10000000 noapictimer tsc=reliable noreplace-smp cocoon.channel=vsock quiet cocoon.debug=1",
		},
		wantNot: []string{"virtio-serial", "agent.sock", "virtserialport"},
	}, {
		name: "sizes",
		p: func() launchParams {
			s := testSpec(hypervisor.AccelTCG, channel.Serial)
			s.VCPUs, s.MemoryMiB, s.Initrd, s.KernelArgs = 1, 4096, "", nil
			return launchParams{spec: s, tbSizeMiB: 24}
		}(),
		want: []string{
			"-m", "4096M",
			"-smp", "1",
			"-append", "console=ttyS0 reboot=t panic=-1 cocoon.channel=serial",
		},
		wantNot: []string{"-initrd"},
	}, {
		name: "commas in the state dir are escaped",
		p: func() launchParams {
			s := testSpec(hypervisor.AccelTCG, channel.Serial)
			s.StateDir = "/run/a,b"
			return launchParams{spec: s, tbSizeMiB: 24}
		}(),
		want: []string{
			"-name", "guest=/run/a,,b",
		},
	}, {
		name: "sockets are named relative to the state dir, whatever its length",
		p: func() launchParams {
			s := testSpec(hypervisor.AccelTCG, channel.Serial)
			s.StateDir = "/run/cocoon/" + strings.Repeat("n", 76) + "/" + strings.Repeat("i", 76)
			return launchParams{spec: s, tbSizeMiB: 24}
		}(),
		want: []string{
			"-chardev", "socket,id=qmp,path=qmp.sock,server=on,wait=off",
			"-chardev", "socket,id=agent,path=agent.sock,server=on,wait=off",
		},
		wantNot: []string{"/run/cocoon/nnn" + strings.Repeat("n", 73) + "/" + strings.Repeat("i", 76) + "/"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			args := commandLine(tc.p)
			for i := 0; i < len(tc.want); i += 2 {
				if !hasPair(args, tc.want[i], tc.want[i+1]) {
					t.Errorf("missing %s %q in %q", tc.want[i], tc.want[i+1], args)
				}
			}
			for _, s := range tc.wantNot {
				for _, a := range args {
					if strings.Contains(a, s) {
						t.Errorf("argument %q contains %q", a, s)
					}
				}
			}
		})
	}
}

func hasPair(args []string, k, v string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == k && args[i+1] == v {
			return true
		}
	}
	return false
}

func TestRandomCIDRange(t *testing.T) {
	for range 10000 {
		if c := randomCID(); c < minCID || c > maxCID {
			t.Fatalf("cid %d out of [%d, %d]", c, minCID, maxCID)
		}
	}
}

func TestClaimCIDRetriesOnlyWhenInUse(t *testing.T) {
	cids := []uint32{10, 11, 12}
	next := func() uint32 { c := cids[0]; cids = cids[1:]; return c }
	var tried []uint32
	inUse := func(cid uint32) error {
		tried = append(tried, cid)
		if cid < 12 {
			return unix.EADDRINUSE
		}
		return nil
	}
	if cid, err := claimCID(inUse, next); err != nil || cid != 12 || len(tried) != 3 {
		t.Fatalf("claimCID = %d, %v after %v", cid, err, tried)
	}
	cids = []uint32{20}
	if _, err := claimCID(func(uint32) error { return unix.EPERM }, next); !errors.Is(err, unix.EPERM) {
		t.Fatalf("other errors must not be retried: %v", err)
	}
	always := func() uint32 { return 5 }
	if _, err := claimCID(func(uint32) error { return unix.EADDRINUSE }, always); err == nil {
		t.Fatal("claimCID must give up")
	}
}

// TestCommandLineMemoryFile: file-backed guest RAM is the machine's
// memory backend, shared for a template's VM and private for a clone,
// and a path with a comma survives QEMU's option syntax.
func TestCommandLineMemoryFile(t *testing.T) {
	for _, tc := range []struct {
		shared bool
		share  string
	}{{true, "share=on"}, {false, "share=off"}} {
		s := testSpec(hypervisor.AccelTCG, channel.Serial)
		s.Memory = &hypervisor.MemoryFile{Path: "/var/lib/cocoon/templates/a,b/mem", Shared: tc.shared}
		args := commandLine(launchParams{spec: s, tbSizeMiB: 20, tscKHz: 1})
		if i := slices.Index(args, "-M"); args[i+1] != "microvm,x-option-roms=off,rtc=on,acpi=off,memory-backend=mem" {
			t.Errorf("machine %q", args[i+1])
		}
		want := "memory-backend-file,id=mem,size=256M,mem-path=/var/lib/cocoon/templates/a,,b/mem," + tc.share
		if i := slices.Index(args, want); i < 1 || args[i-1] != "-object" {
			t.Errorf("shared=%v: no -object %s in %q", tc.shared, want, args)
		}
	}
}
