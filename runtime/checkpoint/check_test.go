package checkpoint

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestCheckMachine(t *testing.T) {
	m := fixtureManifest()
	for _, tc := range []struct {
		name string
		edit func(w *Machine)
		want string // "" for no error
	}{
		{"same", func(w *Machine) {}, ""},
		{"nil and empty lists are the same", func(w *Machine) {
			m.Machine.Devices, w.Devices = nil, []string{}
		}, ""},
		{"memory", func(w *Machine) { w.MemoryMiB = 512 }, "checkpoint was saved with memory_mib 256, this sandbox has 512"},
		{"vcpus", func(w *Machine) { w.VCPUs = 4 }, "checkpoint was saved with vcpus 2, this sandbox has 4"},
		{"driver", func(w *Machine) { w.Driver = "firecracker" }, `checkpoint was saved with driver "qemu", this sandbox has "firecracker"`},
		{"driver version", func(w *Machine) { w.DriverVersion = "8.0.0" }, `driver_version "7.2.19", this sandbox has "8.0.0"`},
		{"machine type", func(w *Machine) { w.MachineType = "q35" }, `machine_type "microvm", this sandbox has "q35"`},
		{"accel", func(w *Machine) { w.Accel = "kvm" }, `accel "tcg", this sandbox has "kvm"`},
		{"channel", func(w *Machine) { w.Channel = "vsock" }, `channel "virtio-serial", this sandbox has "vsock"`},
		{"kernel args", func(w *Machine) { w.KernelArgs = []string{"console=hvc0"} },
			`kernel_args ["console=hvc0" "quiet"], this sandbox has ["console=hvc0"]`},
		{"devices in another order", func(w *Machine) { w.Devices = []string{"virtio-rng", "virtio-scsi", "agent:virtio-serial"} },
			`devices ["virtio-scsi" "virtio-rng" "agent:virtio-serial"], this sandbox has ["virtio-rng" "virtio-scsi" "agent:virtio-serial"]`},
		{"two fields", func(w *Machine) { w.VCPUs, w.MemoryMiB = 1, 128 },
			"checkpoint was saved with vcpus 2, this sandbox has 1; and with memory_mib 256, this sandbox has 128"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m = fixtureManifest()
			want := fixtureManifest().Machine
			tc.edit(&want)
			err := m.CheckMachine(want)
			checkMismatch(t, err, tc.want)
		})
	}
}

func TestCheckGuest(t *testing.T) {
	m := fixtureManifest()
	other := "sha256:" + strings.Repeat("d", 64)
	for _, tc := range []struct {
		name string
		edit func(g *GuestImage)
		want string
	}{
		{"same", func(g *GuestImage) {}, ""},
		{"only the version", func(g *GuestImage) { g.Version = "0.4.1" }, ""},
		{"kernel", func(g *GuestImage) { g.Kernel, g.Version = other, "0.5.0" },
			`checkpoint was saved with guest kernel ` + m.Guest.Kernel + ` (guest image "0.4.0"), this sandbox has ` + other + ` (guest image "0.5.0")`},
		{"initrd", func(g *GuestImage) { g.Initrd = other }, `guest initrd ` + m.Guest.Initrd + ` (guest image "0.4.0"), this sandbox has ` + other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := m.Guest
			tc.edit(&want)
			err := m.CheckGuest(want)
			checkMismatch(t, err, tc.want)
			if tc.name == "kernel" && strings.Contains(err.Error(), "initrd") {
				t.Errorf("error %q names the initrd, which is the same", err)
			}
		})
	}
}

func checkMismatch(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Errorf("error %v, want none", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("no error, want %q", want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if !errors.Is(err, ErrMismatch) || !errdefs.IsFailedPrecondition(err) {
		t.Errorf("error %v: want ErrMismatch and failed precondition", err)
	}
	if errors.Is(err, ErrInvalid) {
		t.Errorf("error %v: a valid checkpoint that does not fit is not ErrInvalid", err)
	}
}

func TestCheckNamespace(t *testing.T) {
	m := fixtureManifest()
	if err := m.CheckNamespace("default", false); err != nil {
		t.Errorf("same namespace: %v", err)
	}
	if err := m.CheckNamespace("k8s.io", true); err != nil {
		t.Errorf("other namespace, allowed: %v", err)
	}
	err := m.CheckNamespace("k8s.io", false)
	if !errdefs.IsPermissionDenied(err) || errors.Is(err, ErrInvalid) || errdefs.IsInvalidArgument(err) {
		t.Errorf("other namespace: %v, want permission denied only", err)
	}
	for _, want := range []string{`"default"`, `"k8s.io"`, "io.cocoon.checkpoint.allow-other-namespace=true"} {
		if err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %s", err, want)
		}
	}
}
