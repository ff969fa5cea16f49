package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu/qmp"
)

func TestDiskNames(t *testing.T) {
	wellFormed := regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._-]*$`)
	for _, id := range []string{"a", "0123abc-layer-3", strings.Repeat("f", maxDiskIDLen), "ctr_1.scratch"} {
		if err := validateDiskID(id); err != nil {
			t.Errorf("validateDiskID(%q) = %v", id, err)
		}
		dev, node := diskDeviceID(id), diskNodeName(id)
		if !wellFormed.MatchString(dev) || !wellFormed.MatchString(node) || len(node) > 31 {
			t.Errorf("id %q: device %q node %q", id, dev, node)
		}
		if h := targetHint(id); h > maxSCSITarget {
			t.Errorf("hint %d", h)
		}
	}
	if diskNodeName("a") == diskNodeName("b") {
		t.Error("node names collide")
	}
	for _, id := range []string{"", strings.Repeat("f", maxDiskIDLen+1), "a b", "a,b", "../x", "é"} {
		if err := validateDiskID(id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("validateDiskID(%q) = %v", id, err)
		}
	}
}

func TestFreeTarget(t *testing.T) {
	taken := scsiTargets{byTarget: map[uint32]string{254: "x", 255: "y", 0: "z"}}
	if got, ok := taken.free(254); !ok || got != 1 {
		t.Errorf("free(254) = %d, %v; want 1 after wrapping", got, ok)
	}
	if got, ok := taken.free(7); !ok || got != 7 {
		t.Errorf("free(7) = %d", got)
	}
	for i := range uint32(maxSCSITarget + 1) {
		taken.byTarget[i] = "d"
	}
	if _, ok := taken.free(3); ok {
		t.Error("a full controller has a free target")
	}
}

// pausedVM starts a QEMU that never runs its guest (-S), with the SCSI
// controller the driver creates, and returns a VM around its QMP: enough
// for the QMP side of hot-plug. QEMU unplugs SCSI disks without the
// guest's help, so detach works here too.
func pausedVM(t *testing.T, withController bool) *VM {
	t.Helper()
	needQEMU(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, QMPSocketName)
	args := []string{"-M", "microvm,x-option-roms=off", "-S", "-accel", "tcg", "-m", "64M",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-chardev", qmpChardev, "-mon", "chardev=qmp,mode=control"}
	if withController {
		args = append(args, "-device", "virtio-scsi-device,id="+SCSIControllerID)
	}
	cmd := exec.Command(DefaultBinary, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var c *qmp.Client
	for {
		var err error
		if c, err = qmp.Dial(ctx, sock, qmp.Options{}); err == nil {
			break
		}
		select {
		case <-exited:
			t.Fatalf("qemu exited: %s", stderr.String())
		case <-ctx.Done():
			t.Fatalf("qmp: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Cleanup(func() {
		c.Close()
		cmd.Process.Kill()
		<-exited
	})
	return &VM{id: "paused", qmp: c, exited: exited, log: log.G(context.Background()).WithField("sandbox", t.Name())}
}

// diskImage makes a sparse image file of size bytes.
func diskImage(t *testing.T, dir, name string, size int64) string {
	t.Helper()
	p := filepath.Join(dir, name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return p
}

func blockNodeCount(t *testing.T, v *VM) int {
	t.Helper()
	nodes, err := v.blockNodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(nodes)
}

func TestAttachDetachQMP(t *testing.T) {
	v := pausedVM(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	layer := diskImage(t, dir, "layer.erofs", 4<<20)
	scratch := diskImage(t, dir, "scratch.ext4", 64<<20)

	a, err := v.AttachDisk(ctx, "c1-layer-0", layer, true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := v.AttachDisk(ctx, "c1-scratch", scratch, false)
	if err != nil {
		t.Fatal(err)
	}
	if a.SCSIID == b.SCSIID || a.LUN != 0 || b.LUN != 0 || a.SCSIID > maxSCSITarget {
		t.Fatalf("addresses %+v %+v", a, b)
	}
	// A second sandbox may attach the same layer: shared read-only.
	if _, err := v.AttachDisk(ctx, "c2-layer-0", layer, true); err != nil {
		t.Fatalf("same layer twice: %v", err)
	}
	// A scratch disk is locked to one writer.
	if _, err := v.AttachDisk(ctx, "c2-scratch", scratch, false); err == nil {
		t.Fatal("a scratch disk attached writable twice")
	} else {
		t.Logf("second writer: %v", err)
	}
	// What QEMU reports matches what AttachDisk returned.
	taken, err := v.scsiTargets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if taken.byDevice[diskDeviceID("c1-layer-0")] != a.SCSIID || taken.byDevice[diskDeviceID("c1-scratch")] != b.SCSIID || len(taken.byDevice) != 3 {
		t.Errorf("qemu says %v", taken.byDevice)
	}
	var ro bool
	if err := v.qmp.Execute(ctx, "qom-get", map[string]any{"path": "/machine/peripheral/" + diskDeviceID("c1-layer-0"), "property": "drive"}, new(string)); err != nil {
		t.Error(err)
	}
	nodes := map[string]bool{}
	var infos []struct {
		NodeName string `json:"node-name"`
		RO       bool   `json:"ro"`
	}
	v.qmp.Execute(ctx, "query-named-block-nodes", map[string]any{"flat": true}, &infos)
	for _, n := range infos {
		nodes[n.NodeName] = true
		if n.NodeName == diskNodeName("c1-layer-0") {
			ro = n.RO
		}
	}
	if !ro {
		t.Error("layer node is not read-only")
	}

	if _, err := v.AttachDisk(ctx, "c1-layer-0", layer, true); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("attach twice: %v", err)
	}
	for _, id := range []string{"c1-layer-0", "c2-layer-0", "c1-scratch"} {
		if err := v.DetachDisk(ctx, id); err != nil {
			t.Fatalf("detach %s: %v", id, err)
		}
	}
	if err := v.DetachDisk(ctx, "c1-scratch"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("detach twice: %v", err)
	}
	if n := blockNodeCount(t, v); n != 0 {
		t.Errorf("%d block nodes left", n)
	}
	// Detached, the scratch disk is free for a writer again, at the
	// address it had (its id hashes to the same hint).
	if again, err := v.AttachDisk(ctx, "c1-scratch", scratch, false); err != nil || again != b {
		t.Errorf("reattach = %+v, %v; want %+v", again, err, b)
	}
}

func TestAttachErrors(t *testing.T) {
	v := pausedVM(t, true)
	ctx := context.Background()
	dir := t.TempDir()
	img := diskImage(t, dir, "d.img", 1<<20)
	for _, tc := range []struct {
		id, path string
		is       error
	}{
		{"bad id", img, errdefs.ErrInvalidArgument},
		{"ok", "relative.img", errdefs.ErrInvalidArgument},
		{"ok", filepath.Join(dir, "missing.img"), errdefs.ErrNotFound},
		{"ok", dir, errdefs.ErrInvalidArgument},
		{"ok", diskImage(t, dir, "empty.img", 0), errdefs.ErrInvalidArgument},
	} {
		if _, err := v.AttachDisk(ctx, tc.id, tc.path, true); !errors.Is(err, tc.is) {
			t.Errorf("AttachDisk(%q, %q) = %v, want %v", tc.id, tc.path, err, tc.is)
		}
	}
	if err := v.DetachDisk(ctx, "never-attached"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("detach unknown: %v", err)
	}
	if n := blockNodeCount(t, v); n != 0 {
		t.Errorf("%d block nodes left", n)
	}
}

// TestAttachUndo makes device_add fail (no controller): the block node
// added before it must go.
func TestAttachUndo(t *testing.T) {
	v := pausedVM(t, false)
	img := diskImage(t, t.TempDir(), "d.img", 1<<20)
	_, err := v.AttachDisk(context.Background(), "x", img, true)
	var qe *qmp.Error
	if err == nil || !errors.As(err, &qe) {
		t.Fatalf("err = %v, want qemu's refusal", err)
	}
	t.Logf("error: %v", err)
	if n := blockNodeCount(t, v); n != 0 {
		t.Errorf("%d block nodes left after a failed attach", n)
	}
}

// TestConcurrentAttach attaches disks whose ids hash to the same target
// from many goroutines at once: QEMU settles the races, every disk gets its
// own target.
func TestConcurrentAttach(t *testing.T) {
	v := pausedVM(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	img := diskImage(t, t.TempDir(), "d.img", 1<<20)
	var ids []string
	hint := targetHint("c-0")
	for i := 0; len(ids) < 6; i++ {
		if id := fmt.Sprint("c-", i); targetHint(id) == hint {
			ids = append(ids, id)
		}
	}
	addrs := make([]hypervisor.DiskAddr, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			addrs[i], errs[i] = v.AttachDisk(ctx, id, img, true)
		}()
	}
	wg.Wait()
	seen := map[uint32]bool{}
	for i := range ids {
		if errs[i] != nil {
			t.Fatalf("attach %s: %v", ids[i], errs[i])
		}
		if seen[addrs[i].SCSIID] {
			t.Errorf("target %d given twice", addrs[i].SCSIID)
		}
		seen[addrs[i].SCSIID] = true
	}
	var wg2 sync.WaitGroup
	for _, id := range ids {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			if err := v.DetachDisk(ctx, id); err != nil {
				t.Errorf("detach %s: %v", id, err)
			}
		}()
	}
	wg2.Wait()
	if n := blockNodeCount(t, v); n != 0 {
		t.Errorf("%d block nodes left", n)
	}
}

// TestAttachFullController fills the controller but for one target, which
// AttachDisk must find, then has no target left.
func TestAttachFullController(t *testing.T) {
	v := pausedVM(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	img := diskImage(t, t.TempDir(), "d.img", 1<<20)
	last := targetHint("last") // the one target left free
	for target := range uint32(maxSCSITarget + 1) {
		if target == last {
			continue
		}
		node := fmt.Sprint("n", target)
		if err := v.qmp.Execute(ctx, "blockdev-add", blockdevArgs(node, img, true), nil); err != nil {
			t.Fatal(err)
		}
		if err := v.qmp.Execute(ctx, "device_add", map[string]any{
			"driver": "scsi-hd", "id": fmt.Sprint("other", target), "bus": "scsi0.0", "scsi-id": target, "lun": 0, "drive": node,
		}, nil); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	addr, err := v.AttachDisk(ctx, "first", img, true)
	if err != nil || addr.SCSIID != last {
		t.Fatalf("attach to a controller with one free target = %+v, %v; want target %d", addr, err, last)
	}
	t.Logf("attach with 255 disks present: %v", time.Since(start).Round(time.Millisecond))
	if _, err := v.AttachDisk(ctx, "one-too-many", img, true); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("257th disk: %v", err)
	}
	if n := blockNodeCount(t, v); n != 2*(maxSCSITarget+1) {
		t.Errorf("%d block nodes, want 512 (raw + file per disk)", n)
	}
}

func TestAttachAfterVMExit(t *testing.T) {
	v := pausedVM(t, true)
	img := diskImage(t, t.TempDir(), "d.img", 1<<20)
	v.qmp.Close()
	_, err := v.AttachDisk(context.Background(), "x", img, true)
	if !errors.Is(err, hypervisor.ErrVMExited) {
		t.Fatalf("err = %v", err)
	}
	if err := v.DetachDisk(context.Background(), "x"); !errors.Is(err, hypervisor.ErrVMExited) {
		t.Fatalf("detach: %v", err)
	}
}

// diskTestInit is PID 1 of the guest in the hot-plug tests (busybox ash).
// It reports on the console every SCSI disk at /sys/bus/scsi/devices/0:0:*
// (the address form the agent relies on): its block device and whether it
// is write-protected; it reads "hello" from an EROFS disk, writes
// upper/guest-wrote on an ext4 one, and times reading a whole EROFS disk
// marked with ".measure".
const diskTestInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "DISKTEST-READY scsi hosts: $(ls /sys/class/scsi_host | tr '\n' ' ')"
seen=" "
while :; do
	cur=" "
	for d in /sys/bus/scsi/devices/0:0:*; do
		[ -e "$d" ] || continue
		a=${d##*/}
		cur="$cur$a "
		case "$seen" in *" $a "*) continue ;; esac
		blk=$(ls $d/block 2>/dev/null)
		if [ -z "$blk" ] || [ ! -r /sys/block/$blk/ro ] || [ ! -b /dev/$blk ]; then
			# Not bound to sd, or its block device not registered
			# (sysfs, devtmpfs) yet: look again next round.
			cur="${cur% $a } "
			continue
		fi
		echo "DISKTEST-DISK $a $blk ro=$(cat /sys/block/$blk/ro)"
		mkdir -p /mnt/$a
		if mount -t erofs -o ro /dev/$blk /mnt/$a 2>/dev/null; then
			[ -e /mnt/$a/hello ] && echo "DISKTEST-CONTENT $a $(cat /mnt/$a/hello)"
			if [ -e /mnt/$a/.measure ]; then
				t0=$(cut -d' ' -f1 /proc/uptime)
				n=$(tar -cf - -C /mnt/$a . | wc -c)
				t1=$(cut -d' ' -f1 /proc/uptime)
				echo "DISKTEST-READ $a $n bytes $(awk "BEGIN{print ($t1-$t0)*1000}") ms"
			fi
			umount /mnt/$a
		elif mount -t ext4 /dev/$blk /mnt/$a; then
			echo guest >/mnt/$a/upper/guest-wrote && sync && echo "DISKTEST-WROTE $a"
			umount /mnt/$a
		fi
	done
	if [ "$cur" != "$seen" ]; then
		echo "DISKTEST-SCSI [$cur]"
		seen="$cur"
	fi
	sleep 0.2
done
`

// cpioEntry is one file of a newc initramfs.
type cpioEntry struct {
	name  string
	mode  uint32 // with the file type bits
	data  []byte
	rdevM uint32
	rdevm uint32
}

// writeCpio writes a newc ("070701") archive, the initramfs format.
func writeCpio(t *testing.T, path string, entries []cpioEntry) {
	t.Helper()
	var b bytes.Buffer
	pad := func() {
		for b.Len()%4 != 0 {
			b.WriteByte(0)
		}
	}
	for i, e := range append(entries, cpioEntry{name: "TRAILER!!!"}) {
		fmt.Fprintf(&b, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			i+1, e.mode, 0, 0, 1, 0, len(e.data), 0, 0, e.rdevM, e.rdevm, len(e.name)+1, 0)
		b.WriteString(e.name)
		b.WriteByte(0)
		pad()
		b.Write(e.data)
		pad()
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// diskTestGuest boots the test kernel with busybox and diskTestInit, and
// returns once the init script runs.
func diskTestGuest(t *testing.T) *VM {
	t.Helper()
	kernel := testKernel(t)
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no busybox for the test guest (apt-get install busybox-static): %v", err)
	}
	if out, err := exec.Command("file", "-L", "/bin/busybox").Output(); err == nil && !bytes.Contains(out, []byte("statically linked")) {
		t.Skip("/bin/busybox is not static (apt-get install busybox-static)")
	}
	initrd := filepath.Join(t.TempDir(), "initrd.cpio")
	writeCpio(t, initrd, []cpioEntry{
		{name: "bin", mode: 0o40755}, {name: "dev", mode: 0o40755}, {name: "proc", mode: 0o40755},
		{name: "sys", mode: 0o40755}, {name: "mnt", mode: 0o40755},
		{name: "dev/console", mode: 0o20600, rdevM: 5, rdevm: 1},
		{name: "bin/busybox", mode: 0o100755, data: busybox},
		{name: "init", mode: 0o100755, data: []byte(diskTestInit)},
	})
	spec := baseSpec(t, kernel)
	spec.Initrd = initrd
	spec.KernelArgs = []string{"quiet"}
	// COCOON_TEST_QEMU may name a wrapper that adapts the machine to the
	// test kernel (e.g. adds acpi=off for a kernel without ACPI).
	vm := launchForTestWith(t, Config{Binary: os.Getenv("COCOON_TEST_QEMU")}, spec)
	m := waitConsole(t, vm, regexp.MustCompile(`DISKTEST-READY scsi hosts: (.*)`), 90*time.Second)
	if strings.TrimSpace(m[1]) == "" {
		t.Fatalf("the guest sees no SCSI host: its kernel does not find the virtio-scsi-device (a kernel without ACPI needs microvm's acpi=off); console:\n%s",
			strings.Join(vm.ConsoleTail(40), "\n"))
	}
	return vm
}

// launchForTestWith is launchForTest with a driver configuration.
func launchForTestWith(t *testing.T, cfg Config, spec hypervisor.Spec) *VM {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	vm, err := New(cfg).launch(ctx, spec)
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := vm.Stop(ctx); err != nil {
			t.Errorf("cleanup Stop: %v", err)
		}
		Cleanup(ctx, spec.StateDir)
		if pid := findQEMU(spec.StateDir); pid != 0 {
			t.Errorf("qemu pid %d still runs after the test", pid)
		}
	})
	return vm
}

// waitConsole waits for a console line matching re and returns its
// submatches.
func waitConsole(t *testing.T, vm *VM, re *regexp.Regexp, d time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		for _, line := range vm.ConsoleTail(400) {
			if m := re.FindStringSubmatch(line); m != nil {
				return m
			}
		}
		select {
		case <-vm.Exited():
			t.Fatalf("guest exited waiting for %s; console:\n%s", re, strings.Join(vm.ConsoleTail(40), "\n"))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no console line %s after %v; console:\n%s", re, d, strings.Join(vm.ConsoleTail(40), "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func needTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s not installed", name)
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// TestHotplugSeenByGuest attaches an EROFS layer read-only and an ext4
// scratch disk read-write to a booted guest and checks what the agent
// relies on: each disk appears at /sys/bus/scsi/devices/0:0:<SCSIID>:0,
// the layer write-protected, its content readable, the scratch writable
// (and the write reaches the host file); after DetachDisk both are gone
// from the guest.
func TestHotplugSeenByGuest(t *testing.T) {
	needTool(t, "mkfs.erofs")
	needTool(t, "mkfs.ext4")
	needTool(t, "debugfs")
	vm := diskTestGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	os.MkdirAll(filepath.Join(tree, "upper"), 0o755)
	os.MkdirAll(filepath.Join(tree, "work"), 0o755)
	os.WriteFile(filepath.Join(tree, "hello"), []byte("hello-from-erofs\n"), 0o644)
	layer := filepath.Join(dir, "layer.erofs")
	run(t, "mkfs.erofs", "--quiet", layer, tree)
	scratch := diskImage(t, dir, "scratch.ext4", 256<<20)
	run(t, "mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-d", tree, scratch)

	start := time.Now()
	la, err := vm.AttachDisk(ctx, "layer-0", layer, true)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := vm.AttachDisk(ctx, "scratch", scratch, false)
	if err != nil {
		t.Fatal(err)
	}
	addr := func(a hypervisor.DiskAddr) string { return fmt.Sprintf("0:0:%d:%d", a.SCSIID, a.LUN) }
	m := waitConsole(t, vm, regexp.MustCompile(`DISKTEST-DISK `+addr(la)+` (sd[a-z]+) ro=(\d)`), 60*time.Second)
	t.Logf("layer at %s is /dev/%s, seen %v after attach", addr(la), m[1], time.Since(start).Round(time.Millisecond))
	if m[2] != "1" {
		t.Errorf("layer disk ro=%s in the guest, want 1", m[2])
	}
	waitConsole(t, vm, regexp.MustCompile(`DISKTEST-CONTENT `+addr(la)+` hello-from-erofs`), 30*time.Second)
	m = waitConsole(t, vm, regexp.MustCompile(`DISKTEST-DISK `+addr(sa)+` (sd[a-z]+) ro=(\d)`), 60*time.Second)
	if m[2] != "0" {
		t.Errorf("scratch disk ro=%s in the guest, want 0", m[2])
	}
	waitConsole(t, vm, regexp.MustCompile(`DISKTEST-WROTE `+addr(sa)), 30*time.Second)
	waitConsole(t, vm, regexp.MustCompile(`DISKTEST-SCSI \[ (`+addr(la)+` `+addr(sa)+`|`+addr(sa)+` `+addr(la)+`) \]`), 30*time.Second)

	for _, id := range []string{"layer-0", "scratch"} {
		if err := vm.DetachDisk(ctx, id); err != nil {
			t.Fatalf("detach %s: %v", id, err)
		}
	}
	waitConsole(t, vm, regexp.MustCompile(`DISKTEST-SCSI \[ \]`), 30*time.Second)
	out, err := exec.Command("debugfs", "-R", "cat /upper/guest-wrote", scratch).Output()
	if err != nil || string(out) != "guest\n" {
		t.Errorf("guest write on the host file: %q, %v", out, err)
	}
	// The same target is usable again once the guest let go.
	again, err := vm.AttachDisk(ctx, "layer-0", layer, true)
	if err != nil || again != la {
		t.Fatalf("reattach = %+v, %v", again, err)
	}
	waitConsole(t, vm, regexp.MustCompile(`DISKTEST-SCSI \[ `+addr(la)+` \]`), 30*time.Second)
}

// TestMeasureLayerRead times reading a whole ~50 MiB layer in the guest,
// from an uncompressed and from an lz4 EROFS image, for docs/rootfs.md.
// Set COCOON_MEASURE=1 to run it.
func TestMeasureLayerRead(t *testing.T) {
	if os.Getenv("COCOON_MEASURE") == "" {
		t.Skip("measurement: set COCOON_MEASURE=1")
	}
	needTool(t, "mkfs.erofs")
	src := "/usr/lib/python3.11"
	if _, err := os.Stat(src); err != nil {
		t.Skipf("no %s to use as a layer", src)
	}
	vm := diskTestGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Second)
	defer cancel()
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	run(t, "cp", "-a", src, tree)
	os.WriteFile(filepath.Join(tree, ".measure"), nil, 0o644)
	for i, opts := range [][]string{{"--quiet"}, {"--quiet", "-zlz4"}, {"--quiet"}, {"--quiet", "-zlz4"}} {
		img := filepath.Join(dir, fmt.Sprint(i, ".erofs"))
		run(t, "mkfs.erofs", append(opts, img, tree)...)
		a, err := vm.AttachDisk(ctx, fmt.Sprint("m", i), img, true)
		if err != nil {
			t.Fatal(err)
		}
		m := waitConsole(t, vm, regexp.MustCompile(fmt.Sprintf(`DISKTEST-READ 0:0:%d:0 (\d+) bytes ([\d.]+) ms`, a.SCSIID)), 500*time.Second)
		fi, _ := os.Stat(img)
		t.Logf("%v: image %d MiB, guest read %s bytes in %s ms", opts, fi.Size()>>20, m[1], m[2])
	}
}
