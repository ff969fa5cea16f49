//go:build linux

package initd

import "testing"

func TestRootIsKernelRootfs(t *testing.T) {
	for _, tc := range []struct {
		name, mountinfo string
		want            bool
	}{
		{"initramfs", "1 1 0:2 / / rw - rootfs rootfs rw\n22 1 0:20 / /proc rw - proc proc rw\n", true},
		{"bind over the initramfs", "1 1 0:2 / / rw - rootfs rootfs rw\n22 1 0:20 / /proc rw - proc proc rw\n25 1 0:2 / / rw - rootfs rootfs rw\n", false},
		{"disk root", "23 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n", false},
		{"nothing on /", "22 1 0:20 / /proc rw - proc proc rw\n", false},
	} {
		if got := RootIsKernelRootfs([]byte(tc.mountinfo)); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
