package checkpoint

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
)

// AllowOtherNamespaceAnnotation, set to "true" on the restored sandbox,
// lets a checkpoint saved in one containerd namespace be restored into
// another (CheckNamespace).
const AllowOtherNamespaceAnnotation = "io.cocoon.checkpoint.allow-other-namespace"

// ErrMismatch is wrapped, together with errdefs.ErrFailedPrecondition, by
// CheckMachine and CheckGuest when a valid checkpoint does not fit the
// sandbox that would restore it.
var ErrMismatch = errors.New("checkpoint does not fit this sandbox")

// mismatchClass is the error CheckMachine and CheckGuest wrap: both
// ErrMismatch and errdefs.ErrFailedPrecondition, reading as the former.
type mismatchClass struct{}

func (mismatchClass) Error() string   { return ErrMismatch.Error() }
func (mismatchClass) Unwrap() []error { return []error{ErrMismatch, errdefs.ErrFailedPrecondition} }

// CheckMachine compares the machine the checkpoint was saved from with
// want, the machine this sandbox would run: a migration stream only
// loads into the same driver and version, machine type, size,
// accelerator, agent channel, kernel command line and device set. The
// error names every field that differs with both values, e.g.
// "checkpoint was saved with memory_mib 256, this sandbox has 512".
func (m *Manifest) CheckMachine(want Machine) error {
	got := m.Machine
	var diffs []string
	str := func(field, saved, have string) {
		if saved != have {
			diffs = append(diffs, fmt.Sprintf("%s %q, this sandbox has %q", field, saved, have))
		}
	}
	num := func(field string, saved, have int) {
		if saved != have {
			diffs = append(diffs, fmt.Sprintf("%s %d, this sandbox has %d", field, saved, have))
		}
	}
	list := func(field string, saved, have []string) {
		if !slices.Equal(saved, have) {
			diffs = append(diffs, fmt.Sprintf("%s %s, this sandbox has %s", field, quoteList(saved), quoteList(have)))
		}
	}
	str("driver", got.Driver, want.Driver)
	str("driver_version", got.DriverVersion, want.DriverVersion)
	str("machine_type", got.MachineType, want.MachineType)
	num("vcpus", got.VCPUs, want.VCPUs)
	num("memory_mib", got.MemoryMiB, want.MemoryMiB)
	str("accel", got.Accel, want.Accel)
	str("channel", got.Channel, want.Channel)
	list("kernel_args", got.KernelArgs, want.KernelArgs)
	list("devices", got.Devices, want.Devices)
	return mismatch(diffs)
}

// CheckGuest compares the guest image the checkpoint's VM booted with
// want: the saved memory holds that kernel and initrd, so a restore needs
// the same files. The error names the digest that differs.
func (m *Manifest) CheckGuest(want GuestImage) error {
	got := m.Guest
	var diffs []string
	for _, f := range []struct{ what, saved, have string }{
		{"kernel", got.Kernel, want.Kernel},
		{"initrd", got.Initrd, want.Initrd},
	} {
		if f.saved != f.have {
			diffs = append(diffs, fmt.Sprintf("guest %s %s (guest image %q), this sandbox has %s (guest image %q)",
				f.what, f.saved, got.Version, f.have, want.Version))
		}
	}
	return mismatch(diffs)
}

// mismatch is the error of CheckMachine and CheckGuest for diffs, nil if
// there are none.
func mismatch(diffs []string) error {
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("checkpoint was saved with %s: %w", strings.Join(diffs, "; and with "), mismatchClass{})
}

// CheckNamespace refuses, with errdefs.ErrPermissionDenied, to restore a
// checkpoint saved in another containerd namespace than ns, unless
// allowOther (the sandbox's AllowOtherNamespaceAnnotation) says so: a
// checkpoint carries the memory of another tenant's sandbox.
func (m *Manifest) CheckNamespace(ns string, allowOther bool) error {
	if m.Namespace == ns || allowOther {
		return nil
	}
	return fmt.Errorf("checkpoint was saved in namespace %q, this sandbox is in namespace %q; set the annotation %s=true to restore it here: %w",
		m.Namespace, ns, AllowOtherNamespaceAnnotation, errdefs.ErrPermissionDenied)
}

// quoteList shows a list of strings with each quoted, so that an empty
// or spaced element is visible.
func quoteList(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(q, " ") + "]"
}
