//go:build linux

package initd

import (
	"bufio"
	"fmt"
	"os"
	"strings"

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
// first, without the root.
func mountpoints() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		var out []string
		for i := len(mounts) - 1; i >= 0; i-- {
			out = append(out, mounts[i].target)
		}
		return out
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[4] == "/" {
			continue
		}
		mps = append(mps, unescapeMount(fields[4]))
	}
	for i, j := 0, len(mps)-1; i < j; i, j = i+1, j-1 {
		mps[i], mps[j] = mps[j], mps[i]
	}
	return mps
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
