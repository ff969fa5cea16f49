package qemu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu/qmp"
)

var _ hypervisor.Planner = (*Driver)(nil)

// Plan says what machine Launch would start for spec: the QEMU binary and
// its identity on disk, the machine type and the boot-time devices. It
// reads no more than the binary's metadata, so it costs a stat.
func (d *Driver) Plan(spec hypervisor.Spec) (hypervisor.Plan, error) {
	bin, err := exec.LookPath(d.cfg.Binary)
	if err != nil {
		return hypervisor.Plan{}, fmt.Errorf("qemu binary %q: %w", d.cfg.Binary, errors.Join(errdefs.ErrNotFound, err))
	}
	if resolved, err := filepath.EvalSymlinks(bin); err == nil {
		bin = resolved
	}
	if abs, err := filepath.Abs(bin); err == nil {
		bin = abs
	}
	fi, err := os.Stat(bin)
	if err != nil {
		return hypervisor.Plan{}, fmt.Errorf("qemu binary: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return hypervisor.Plan{}, fmt.Errorf("qemu binary %s: no file status", bin)
	}
	m := machineOf(spec, qmp.Version{})
	return hypervisor.Plan{
		Driver:  DriverName,
		VMM:     bin,
		VMMID:   fmt.Sprintf("dev=%d,ino=%d,size=%d,mtime=%d", st.Dev, st.Ino, st.Size, fi.ModTime().UnixNano()),
		Type:    m.Type,
		Devices: m.Devices,
	}, nil
}
