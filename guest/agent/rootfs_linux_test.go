package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/api"
)

// The fake /dev of these tests never gets a node: the rootfs makes its
// own at once instead of waiting for devtmpfs.
func init() { devNodeWait = 0 }

// fakeMounter records what DiskRootfs asks of the kernel.
type fakeMounter struct {
	mu    sync.Mutex // guards calls
	calls []string
	// fail makes the mount onto a target with this suffix fail.
	fail string
	// notYet is how many mounts fail with ENXIO first, as a disk that is
	// in sysfs but not yet openable does.
	notYet int
}

func (f *fakeMounter) record(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, s)
}

func (f *fakeMounter) mount(source, target, fstype string, flags uintptr, data string) error {
	if f.fail != "" && strings.HasSuffix(target, f.fail) {
		return unix.EINVAL
	}
	f.mu.Lock()
	notYet := f.notYet > 0
	if notYet {
		f.notYet--
	}
	f.mu.Unlock()
	if notYet {
		return unix.ENXIO
	}
	f.record(fmt.Sprintf("mount %s %s %s ro=%v %s", filepath.Base(source), target, fstype, flags&unix.MS_RDONLY != 0, data))
	return nil
}

func (f *fakeMounter) mountIn(dir, source, target, fstype string, flags uintptr, data string) error {
	if f.fail != "" && strings.HasSuffix(target, f.fail) {
		return unix.EINVAL
	}
	f.record(fmt.Sprintf("mount-in %s %s %s %s %s", dir, source, target, fstype, data))
	return nil
}

func (f *fakeMounter) unmount(target string) error {
	f.record("umount " + target)
	return nil
}

func (f *fakeMounter) syncfs(dir string) error {
	f.record("syncfs " + dir)
	return nil
}

func (f *fakeMounter) mknodBlock(path string, major, minor uint32) error {
	f.record(fmt.Sprintf("mknod %s %d:%d", filepath.Base(path), major, minor))
	return os.WriteFile(path, nil, 0o600)
}

func (f *fakeMounter) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// fakeSys makes a sysfs with SCSI disks id:0 -> name, and /dev nodes for
// those listed in devNodes (regular files stand in for device nodes, so
// device() falls back to mknod for all of them).
func fakeSys(t *testing.T, disks map[uint32]string) (sysDir string) {
	t.Helper()
	sysDir = t.TempDir()
	for id, name := range disks {
		addDisk(t, sysDir, id, name)
	}
	return sysDir
}

func addDisk(t *testing.T, sysDir string, id uint32, name string) {
	t.Helper()
	dev := filepath.Join(sysDir, "bus", "scsi", "devices", fmt.Sprintf("0:0:%d:0", id), "block", name)
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	cls := filepath.Join(sysDir, "class", "block", name)
	if err := os.MkdirAll(cls, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cls, "dev"), fmt.Appendf(nil, "8:%d\n", id*16), 0o644); err != nil {
		t.Fatal(err)
	}
}

func layer(id uint32) *api.Disk { return &api.Disk{ScsiId: id, Fstype: "erofs", ReadOnly: true} }

func TestOverlayData(t *testing.T) {
	got, err := overlayData([]string{"0", "1", "2"}, "/s/upper", "/s/work")
	if err != nil {
		t.Fatal(err)
	}
	// Top-most first: the last layer of the image wins.
	if want := "lowerdir=2:1:0,upperdir=/s/upper,workdir=/s/work"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got, err := overlayData([]string{"0", "1"}, "", ""); err != nil || got != "lowerdir=1:0" {
		t.Fatalf("read-only overlay: %q %v", got, err)
	}
	for name, f := range map[string]func() error{
		"no layers":        func() error { _, err := overlayData(nil, "/u", "/w"); return err },
		"one without uppr": func() error { _, err := overlayData([]string{"0"}, "", ""); return err },
		"colon in path":    func() error { _, err := overlayData([]string{"a:b", "c"}, "", ""); return err },
		"comma in upper":   func() error { _, err := overlayData([]string{"0"}, "/u,x", "/w"); return err },
		"over a page":      func() error { _, err := overlayData([]string{"0"}, strings.Repeat("u", 5000), "/w"); return err },
	} {
		if err := f(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: want invalid argument, got %v", name, err)
		}
	}
	// 500 relative layer names fit where absolute paths would not.
	names := make([]string, maxLayers)
	for i := range names {
		names[i] = fmt.Sprint(i)
	}
	if _, err := overlayData(names, "/run/cocoon/containers/"+strings.Repeat("c", 76)+"/scratch/upper", "/run/cocoon/containers/"+strings.Repeat("c", 76)+"/scratch/work"); err != nil {
		t.Fatalf("500 layers: %v", err)
	}
}

func TestValidateRootfs(t *testing.T) {
	if err := validateRootfs(&api.Rootfs{Layers: []*api.Disk{layer(1)}, Scratch: &api.Disk{ScsiId: 2, Fstype: "ext4"}}); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*api.Rootfs{
		"nil":             nil,
		"no layers":       {Scratch: &api.Disk{Fstype: "ext4"}},
		"bad layer fs":    {Layers: []*api.Disk{{Fstype: "xfs"}}},
		"bad scratch fs":  {Layers: []*api.Disk{layer(1)}, Scratch: &api.Disk{Fstype: "erofs"}},
		"ro scratch":      {Layers: []*api.Disk{layer(1)}, Scratch: &api.Disk{Fstype: "ext4", ReadOnly: true}},
		"too many layers": {Layers: make([]*api.Disk, maxLayers+1)},
	} {
		if err := validateRootfs(r); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: want invalid argument, got %v", name, err)
		}
	}
}

func TestAssembleOverlay(t *testing.T) {
	sys := fakeSys(t, map[uint32]string{1: "sda", 2: "sdb", 3: "sdc"})
	m := &fakeMounter{}
	d := &DiskRootfs{SysDir: sys, DevDir: t.TempDir(), Timeout: time.Second, sys: m}
	dir := t.TempDir()
	written := filepath.Join(sys, "fs", "ext4", "sdc", "lifetime_write_kbytes")
	if err := os.MkdirAll(filepath.Dir(written), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(written, []byte("1200\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &api.Rootfs{Layers: []*api.Disk{layer(1), layer(2)}, Scratch: &api.Disk{ScsiId: 3, Fstype: "ext4"}}
	mounted, err := d.Assemble(context.Background(), dir, r)
	if err != nil {
		t.Fatal(err)
	}
	root, release := mounted.Root, mounted.Release
	if root != filepath.Join(dir, "rootfs") {
		t.Fatalf("root %s", root)
	}
	for _, p := range []string{"scratch/upper", "scratch/work", "layers/0", "layers/1"} {
		if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || !fi.IsDir() {
			t.Fatalf("%s: %v", p, err)
		}
	}
	want := []string{
		"mknod dev-sda 8:16",
		"mount dev-sda " + dir + "/layers/0 erofs ro=true ",
		"mknod dev-sdb 8:32",
		"mount dev-sdb " + dir + "/layers/1 erofs ro=true ",
		"mknod dev-sdc 8:48",
		"mount dev-sdc " + dir + "/scratch ext4 ro=false ",
		"mount-in " + dir + "/layers overlay " + dir + "/rootfs overlay lowerdir=1:0,upperdir=" + dir + "/scratch/upper,workdir=" + dir + "/scratch/work",
		// The write count's base, once the overlay is up.
		"syncfs " + dir + "/scratch",
	}
	if got := m.take(); !reflect.DeepEqual(got, want) {
		t.Fatalf("mounts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Changed syncs, then compares the filesystem's write count.
	if changed, err := mounted.Changed(); err != nil || changed {
		t.Fatalf("changed = %v, %v before any write", changed, err)
	}
	if err := os.WriteFile(written, []byte("1204\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if changed, err := mounted.Changed(); err != nil || !changed {
		t.Fatalf("changed = %v, %v after a write", changed, err)
	}
	if got := m.take(); !reflect.DeepEqual(got, []string{"syncfs " + dir + "/scratch", "syncfs " + dir + "/scratch"}) {
		t.Fatalf("Changed did %q, want a syncfs each", got)
	}
	if err := release(context.Background()); err != nil {
		t.Fatal(err)
	}
	want = []string{
		"umount " + dir + "/rootfs",
		"syncfs " + dir + "/scratch",
		"umount " + dir + "/scratch",
		"umount " + dir + "/layers/1",
		"umount " + dir + "/layers/0",
	}
	if got := m.take(); !reflect.DeepEqual(got, want) {
		t.Fatalf("unmounts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestAssembleSingleLayer(t *testing.T) {
	sys := fakeSys(t, map[uint32]string{4: "sdd"})
	m := &fakeMounter{}
	d := &DiskRootfs{SysDir: sys, DevDir: t.TempDir(), sys: m}
	dir := t.TempDir()
	mounted, err := d.Assemble(context.Background(), dir, &api.Rootfs{Layers: []*api.Disk{layer(4)}})
	if err != nil {
		t.Fatal(err)
	}
	root, release := mounted.Root, mounted.Release
	if mounted.Changed != nil {
		t.Error("a root of one read-only layer has a writable layer to report")
	}
	want := []string{"mknod dev-sdd 8:64", "mount dev-sdd " + root + " erofs ro=true "}
	if got := m.take(); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q", got)
	}
	_ = release(context.Background())
	if got := m.take(); !reflect.DeepEqual(got, []string{"umount " + root}) {
		t.Fatalf("got %q", got)
	}
}

// A disk that sysfs shows but that cannot be opened yet (ENXIO) is
// mounted once it can.
func TestAssembleRetriesDiskNotYetOpenable(t *testing.T) {
	sys := fakeSys(t, map[uint32]string{4: "sdd"})
	m := &fakeMounter{notYet: 3}
	d := &DiskRootfs{SysDir: sys, DevDir: t.TempDir(), sys: m}
	mounted, err := d.Assemble(context.Background(), t.TempDir(), &api.Rootfs{Layers: []*api.Disk{layer(4)}})
	if err != nil {
		t.Fatal(err)
	}
	root := mounted.Root
	want := []string{"mknod dev-sdd 8:64", "mount dev-sdd " + root + " erofs ro=true "}
	if got := m.take(); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q", got)
	}
}

func TestAssembleUnwindsOnFailure(t *testing.T) {
	sys := fakeSys(t, map[uint32]string{1: "sda", 2: "sdb", 3: "sdc"})
	m := &fakeMounter{fail: "/rootfs"}
	d := &DiskRootfs{SysDir: sys, DevDir: t.TempDir(), sys: m}
	dir := t.TempDir()
	_, err := d.Assemble(context.Background(), dir, &api.Rootfs{Layers: []*api.Disk{layer(1), layer(2)}, Scratch: &api.Disk{ScsiId: 3, Fstype: "ext4"}})
	if err == nil || !strings.Contains(err.Error(), "mount overlay") {
		t.Fatalf("want overlay failure, got %v", err)
	}
	var unmounts []string
	for _, c := range m.take() {
		if strings.HasPrefix(c, "umount") || strings.HasPrefix(c, "syncfs") {
			unmounts = append(unmounts, c)
		}
	}
	want := []string{"syncfs " + dir + "/scratch", "umount " + dir + "/scratch", "umount " + dir + "/layers/1", "umount " + dir + "/layers/0"}
	if !reflect.DeepEqual(unmounts, want) {
		t.Fatalf("undo: %q", unmounts)
	}
}

func TestWaitForDisk(t *testing.T) {
	sys := fakeSys(t, nil)
	d := &DiskRootfs{SysDir: sys, DevDir: t.TempDir(), Timeout: 5 * time.Second, sys: &fakeMounter{}}
	go func() {
		time.Sleep(200 * time.Millisecond)
		addDisk(t, sys, 7, "sdq")
	}()
	start := time.Now()
	name, err := d.waitBlock(context.Background(), &api.Disk{ScsiId: 7})
	if err != nil || name != "sdq" {
		t.Fatalf("got %q %v", name, err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("took %v", time.Since(start))
	}

	// A disk that never comes: bounded, named in the error, and the
	// SCSI host was asked to rescan once.
	if err := os.MkdirAll(filepath.Join(sys, "class", "scsi_host", "host0"), 0o755); err != nil {
		t.Fatal(err)
	}
	d.Timeout = 1500 * time.Millisecond
	_, err = d.waitBlock(context.Background(), &api.Disk{ScsiId: 9, Lun: 1})
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "0:0:9:1") {
		t.Fatalf("missing disk: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(sys, "class", "scsi_host", "host0", "scan")); err != nil || string(b) != "0 9 1" {
		t.Fatalf("rescan: %q %v", b, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.waitBlock(ctx, &api.Disk{ScsiId: 10}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestParseDevNumber(t *testing.T) {
	if maj, min, err := parseDevNumber("8:16"); err != nil || maj != 8 || min != 16 {
		t.Fatalf("%d:%d %v", maj, min, err)
	}
	for _, s := range []string{"", "8", "a:b", "8:-1"} {
		if _, _, err := parseDevNumber(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
}

// Without the filesystem's write count every flush reports a change: the
// host then copies the layer back, which is never wrong.
func TestChangedWithoutWriteCount(t *testing.T) {
	sys := fakeSys(t, map[uint32]string{1: "sda", 3: "sdc"})
	d := &DiskRootfs{SysDir: sys, DevDir: t.TempDir(), Timeout: time.Second, sys: &fakeMounter{}}
	mounted, err := d.Assemble(context.Background(), t.TempDir(), &api.Rootfs{Layers: []*api.Disk{layer(1)}, Scratch: &api.Disk{ScsiId: 3, Fstype: "ext4"}})
	if err != nil {
		t.Fatal(err)
	}
	if changed, _ := mounted.Changed(); !changed {
		t.Error("no write count, and Changed says nothing changed")
	}
}
