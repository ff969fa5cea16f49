//go:build linux

package initd

import (
	"fmt"
	"os"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// PowerOff ends the guest: as PID 1 it kills every other process, then it
// syncs, unmounts every filesystem but the root (best effort, innermost
// first) and powers off. If the kernel cannot power off, it restarts,
// which ends a VM run with -no-reboot just the same; a kernel that halts
// instead makes PID 1 exit and panic, which panic=-1 turns into a restart.
// It returns only if all of that failed.
func PowerOff() error {
	if os.Getpid() == 1 {
		// Processes must not write to filesystems being unmounted.
		_ = unix.Kill(-1, unix.SIGKILL)
	}
	unix.Sync()
	for _, mp := range mountpoints() {
		if err := unix.Unmount(mp, 0); err != nil {
			// Busy: detach it so at least its block device is idle
			// once the last user is gone.
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
	}
	unix.Sync()
	// A reset, not a power-off: the guest kernel has no ACPI, so a
	// power-off would only halt the CPUs and leave QEMU running. QEMU
	// runs with -no-reboot and the kernel with reboot=t, so the reset (a
	// triple fault) ends QEMU at once.
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return nil
}

// mountpoints lists mount points from /proc/self/mountinfo, innermost
// (latest mounted) first, without the root.
func mountpoints() []string {
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		// No /proc: what init mounted itself, in reverse.
		var out []string
		for i := len(mounts) - 1; i >= 0; i-- {
			out = append(out, mounts[i].target)
		}
		return out
	}
	var mps []string
	for i := len(infos) - 1; i >= 0; i-- {
		if infos[i].Mountpoint != "/" {
			mps = append(mps, infos[i].Mountpoint)
		}
	}
	return mps
}
