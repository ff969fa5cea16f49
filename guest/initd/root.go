//go:build linux

package initd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// rootBindDir is where the initramfs is bind-mounted on its way to /.
const rootBindDir = "/.root"

// leaveRootfs puts a bind mount of the initramfs over it and enters it,
// the way switch_root enters a new root but without copying anything.
// The kernel's rootfs has no parent mount, so pivot_root(2) cannot move
// away from it and the OCI runtime would have to enter containers with
// MS_MOVE and chroot, from which a process with CAP_SYS_CHROOT can climb
// out; from a mount over rootfs, pivot_root works. It needs /proc, and
// carries the mounts made so far along (the bind is recursive).
func leaveRootfs() error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	if !RootIsKernelRootfs(b) {
		return nil
	}
	if err := os.Mkdir(rootBindDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := unix.Mount("/", rootBindDir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind / on %s: %w", rootBindDir, err)
	}
	if err := unix.Chdir(rootBindDir); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move %s onto /: %w", rootBindDir, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot into the bind mount: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	// The directory the bind passed through, seen from the new root.
	_ = os.Remove(rootBindDir)
	return nil
}

// RootIsKernelRootfs reports whether the mount in effect on / (the last
// one listed there in mountinfo) is the kernel's rootfs itself: the one
// mount whose parent is itself, which pivot_root(2) cannot leave.
func RootIsKernelRootfs(mountinfo []byte) bool {
	last := false
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		// id parent major:minor root mountpoint options... - fstype ...
		f := strings.Fields(sc.Text())
		if len(f) < 5 || f[4] != "/" {
			continue
		}
		last = f[0] == f[1]
	}
	return last
}
