package qemu

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

// TestCommandLineRestore checks that a restore runs the machine it was
// saved from: the boot's command line, the agent port named, and QEMU
// waiting paused for the state.
func TestCommandLineRestore(t *testing.T) {
	for _, ch := range []channel.Kind{channel.Serial, channel.Vsock} {
		boot := launchParams{spec: testSpec(hypervisor.AccelTCG, ch), tbSizeMiB: 20, tscKHz: 2596094, cid: 7}
		restore := boot
		restore.spec.Restore = &hypervisor.Restore{State: os.Stdin}
		want := slices.Clone(commandLine(boot))
		if ch == channel.Serial {
			i := slices.Index(want, "virtserialport,chardev=agent,name=io.cocoon.agent.0")
			if i < 0 {
				t.Fatalf("no agent port in %q", want)
			}
			want[i] += ",id=agent-port"
		}
		want = append(want, "-S", "-incoming", "defer")
		if got := commandLine(restore); !slices.Equal(got, want) {
			t.Errorf("%s restore command line:\n got %q\nwant %q", ch, got, want)
		}
	}
}

func TestValidateRestore(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	os.WriteFile(img, []byte("disk"), 0o600)
	disk := func(id string, target uint32) hypervisor.Disk {
		return hypervisor.Disk{ID: id, Path: img, ReadOnly: true, Addr: hypervisor.DiskAddr{SCSIID: target}}
	}
	ok := &hypervisor.Restore{State: os.Stdin, Disks: []hypervisor.Disk{disk("a", 1), disk("b", 2)}}
	if err := validateRestore(ok); err != nil {
		t.Fatalf("valid restore refused: %v", err)
	}
	for name, tc := range map[string]struct {
		r    *hypervisor.Restore
		want error
	}{
		"no state":       {&hypervisor.Restore{}, errdefs.ErrInvalidArgument},
		"duplicate id":   {&hypervisor.Restore{State: os.Stdin, Disks: []hypervisor.Disk{disk("a", 1), disk("a", 2)}}, errdefs.ErrInvalidArgument},
		"shared target":  {&hypervisor.Restore{State: os.Stdin, Disks: []hypervisor.Disk{disk("a", 1), disk("b", 1)}}, errdefs.ErrInvalidArgument},
		"target too big": {&hypervisor.Restore{State: os.Stdin, Disks: []hypervisor.Disk{disk("a", 256)}}, errdefs.ErrInvalidArgument},
		"lun":            {&hypervisor.Restore{State: os.Stdin, Disks: []hypervisor.Disk{{ID: "a", Path: img, Addr: hypervisor.DiskAddr{LUN: 1}}}}, errdefs.ErrInvalidArgument},
		"bad id":         {&hypervisor.Restore{State: os.Stdin, Disks: []hypervisor.Disk{disk("a b", 1)}}, errdefs.ErrInvalidArgument},
		"missing file":   {&hypervisor.Restore{State: os.Stdin, Disks: []hypervisor.Disk{{ID: "a", Path: filepath.Join(dir, "gone")}}}, errdefs.ErrNotFound},
	} {
		if err := validateRestore(tc.r); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

func TestMigrationDone(t *testing.T) {
	for _, tc := range []struct {
		info     migrationInfo
		done, ok bool
	}{
		{migrationInfo{Status: "active"}, false, true},
		{migrationInfo{Status: "setup"}, false, true},
		{migrationInfo{Status: "completed"}, true, true},
		{migrationInfo{Status: "failed", ErrorDesc: "Unable to write to file"}, true, false},
		{migrationInfo{Status: "cancelled"}, true, false},
	} {
		done, err := migrationDone(tc.info)
		if done != tc.done || (err == nil) != tc.ok {
			t.Errorf("%+v: done %v err %v", tc.info, done, err)
		}
	}
}
