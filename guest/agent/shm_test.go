//go:build linux

package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSandboxShm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "run", "shm")
	d := newSandboxShm(Config{ShmDir: dir})
	other, err := decodeBundleSpec([]byte(`{"mounts":[{"destination":"/data","type":"bind","source":"/run/cocoon/shared/c/0"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.prepare(context.Background(), "c", other); err != nil || d.once.mounted {
		t.Fatalf("a spec without the shm: mounted %v, %v", d.once.mounted, err)
	}
	binds, err := decodeBundleSpec([]byte(`{"mounts":[{"destination":"/dev/shm","type":"bind","source":"` + dir + `","options":["rbind","rw"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := d.prepare(context.Background(), "c", binds); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != unix.TMPFS_MAGIC || st.Flags&unix.ST_NOEXEC == 0 || st.Flags&unix.ST_NODEV == 0 || st.Flags&unix.ST_NOSUID == 0 {
		t.Fatalf("statfs: type %#x flags %#x: want a noexec, nodev, nosuid tmpfs", st.Type, st.Flags)
	}
	if got := int64(st.Blocks) * st.Bsize; got != 64<<20 {
		t.Errorf("size %d, want 64 MiB", got)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Fatalf("mode %v (%v): want sticky 0777", fi.Mode(), err)
	}
	// Mounted once: a second tmpfs would hide the first one's files.
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if n := countFields(string(mounts), dir); n != 1 {
		t.Errorf("%d mounts on %s, want 1", n, dir)
	}
}

// countFields counts the lines of mountinfo whose mount point is dir.
func countFields(mountinfo, dir string) int {
	n := 0
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n
}
