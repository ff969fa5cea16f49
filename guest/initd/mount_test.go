//go:build linux

package initd

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestIsMountpoint(t *testing.T) {
	if ok, err := isMountpoint("/proc"); err != nil || !ok {
		t.Fatalf("/proc: %v %v", ok, err)
	}
	dir := t.TempDir()
	if ok, err := isMountpoint(dir); err != nil || ok {
		t.Fatalf("%s: %v %v", dir, ok, err)
	}
}

// TestMountIdempotent mounts a tmpfs twice through mount(): the second
// call must see the first and leave it alone. Needs root.
func TestMountIdempotent(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	target := filepath.Join(t.TempDir(), "m")
	spec := mountSpec{"tmpfs", target, "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755,size=1m", 0o755}
	if err := mount(spec); err != nil {
		t.Skipf("cannot mount tmpfs here: %v", err)
	}
	defer unix.Unmount(target, unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(target, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := mount(spec); err != nil {
		t.Fatal(err)
	}
	// Still the first mount: a second would hide the marker.
	if _, err := os.Stat(filepath.Join(target, "marker")); err != nil {
		t.Fatalf("second mount stacked over the first: %v", err)
	}
}
