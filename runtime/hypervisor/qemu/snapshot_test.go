package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/agent"
	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

// These tests boot the guest image (build/guest: the agent as /init) and
// skip, saying so, when it is missing.

// agentImage returns the guest image's kernel and initrd.
func agentImage(t *testing.T) (kernel, initrd string) {
	t.Helper()
	needQEMU(t)
	root := moduleRoot()
	kernel = filepath.Join(root, "build", "guest", "vmlinux")
	initrd = filepath.Join(root, "build", "guest", "initrd.img")
	for _, p := range []string{kernel, initrd} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("no guest image (%v): run `make guest` to build build/guest", err)
		}
	}
	return kernel, initrd
}

// agentSpec is a spec for the guest image with memMiB of RAM.
func agentSpec(t *testing.T, memMiB int) hypervisor.Spec {
	kernel, initrd := agentImage(t)
	spec := baseSpec(t, kernel)
	spec.Initrd = initrd
	spec.KernelHZ = 100
	spec.KernelArgs = []string{"quiet", "no_timer_check"}
	spec.MemoryMiB = memMiB
	return spec
}

// connectAgent opens a new agent session on vm and waits for the agent's
// answer.
func connectAgent(t *testing.T, ctx context.Context, vm *VM) (*agent.Client, agent.GuestInfo) {
	t.Helper()
	return agentOn(t, ctx, vm.AgentEndpoint(), vm.ConsoleTail)
}

// agentOn opens one agent session on ep, booting guest or restored one
// alike (Connect's handshake waits for the agent to take the channel),
// and waits for the agent's answer. console, if set, is quoted when the
// agent does not answer.
func agentOn(t *testing.T, ctx context.Context, ep channel.Endpoint, console func(int) []string) (*agent.Client, agent.GuestInfo) {
	t.Helper()
	fail := func(format string, err error) {
		t.Helper()
		tail := ""
		if console != nil {
			tail = "; console:\n" + strings.Join(console(30), "\n")
		}
		t.Fatalf(format+"%s", err, tail)
	}
	start := time.Now()
	conn, err := ep.Dial(ctx)
	if err != nil {
		t.Fatalf("dial agent: %v", err)
	}
	c, err := agent.Connect(ctx, conn)
	if err != nil {
		fail("agent session: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	handover := time.Since(start)
	info, err := c.WaitReady(ctx)
	if err != nil {
		fail("agent: %v", err)
	}
	t.Logf("agent session: handover %v, first answer %v after the dial",
		handover.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	return c, info
}

// saveTo pauses vm and saves it to a new file at path.
func saveTo(t *testing.T, ctx context.Context, vm *VM, path string) (hypervisor.SavedState, time.Duration) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	start := time.Now()
	if err := vm.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	saved, err := vm.Save(ctx, f)
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	return saved, time.Since(start)
}

// restoreFrom launches a restore of the state at path into a new state
// dir, registered for cleanup like launchForTest, and returns once the
// guest runs.
func restoreFrom(t *testing.T, spec hypervisor.Spec, path string, disks []hypervisor.Disk) (*VM, time.Duration) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	spec.StateDir = t.TempDir()
	spec.Restore = &hypervisor.Restore{State: f, Disks: disks, Resume: true}
	start := time.Now()
	vm := launchForTest(t, spec)
	return vm, time.Since(start)
}

// TestSaveRestore boots the guest image with a disk attached, saves it,
// lets it run on, stops it, and restores the state into a new QEMU: the
// restored guest answers a new agent session with an uptime that went on
// from the saved one (no reboot), and holds the disk where it was.
func TestSaveRestore(t *testing.T) {
	spec := agentSpec(t, 256)
	vm := launchForTest(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	old, info := connectAgent(t, ctx, vm)
	t.Logf("booted: uptime %v", info.Uptime)

	disk := diskImage(t, t.TempDir(), "layer.img", 1<<20)
	addr, err := vm.AttachDisk(ctx, "layer-0", disk, true)
	if err != nil {
		t.Fatal(err)
	}
	// A running guest is refused.
	if _, err := vm.Save(ctx, os.Stdout); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Save of a running guest = %v, want failed precondition", err)
	}

	// A state file QEMU cannot write fails the save; the guest stays
	// paused and a later save works.
	ro, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Save(ctx, ro); err == nil {
		t.Fatal("Save to a read-only descriptor succeeded")
	} else {
		t.Logf("save to a read-only descriptor: %v", err)
	}
	ro.Close()
	if st, err := vm.QMP().QueryStatus(ctx); err != nil || st.Running {
		t.Fatalf("after a failed save the guest is %+v, %v; want paused", st, err)
	}

	state := filepath.Join(t.TempDir(), "vm.state")
	saved, took := saveTo(t, ctx, vm, state)
	fi, err := os.Stat(state)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pause+save %v, state %d KiB (reported %d KiB), guest RAM touched %d KiB", took.Round(time.Millisecond), fi.Size()>>10, saved.Bytes>>10, guestTouchedKiB(t, vm.PID(), spec.MemoryMiB))
	want := []hypervisor.Disk{{ID: "layer-0", Path: disk, ReadOnly: true, Addr: addr}}
	if len(saved.Disks) != 1 || saved.Disks[0] != want[0] {
		t.Errorf("saved disks = %+v, want %+v", saved.Disks, want)
	}
	if saved.Bytes != fi.Size() {
		t.Errorf("saved %d bytes, the file holds %d", saved.Bytes, fi.Size())
	}

	// The saved guest runs on (a checkpoint without exit), its session
	// intact.
	if err := vm.Resume(ctx); err != nil {
		t.Fatalf("Resume after Save: %v", err)
	}
	if _, err := old.Ping(ctx); err != nil {
		t.Fatalf("ping after Resume: %v", err)
	}
	if err := vm.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// The restored guest resumes inside the session it had when saved;
	// the first session of a new host is answered all the same.
	start := time.Now()
	restored, took := restoreFrom(t, spec, state, saved.Disks)
	_, rinfo := connectAgent(t, ctx, restored)
	t.Logf("running %v after launch; agent answered %v after launch; uptime %v (saved after %v)",
		took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), rinfo.Uptime, info.Uptime)
	if rinfo.Uptime < info.Uptime {
		t.Errorf("restored uptime %v < %v before the save: the guest rebooted", rinfo.Uptime, info.Uptime)
	}
	for _, line := range restored.ConsoleTail(200) {
		if strings.Contains(line, "Linux version") {
			t.Errorf("the restored guest booted a kernel: %q", line)
		}
	}
	disks, err := restored.attachedDisks(ctx)
	if err != nil || len(disks) != 1 || disks[0] != want[0] {
		t.Errorf("restored disks = %+v, %v, want %+v", disks, err, want)
	}

	// A state cut short fails to load and leaves nothing behind.
	data, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(t.TempDir(), "cut.state")
	os.WriteFile(cut, data[:len(data)/2], 0o600)
	cf, _ := os.Open(cut)
	defer cf.Close()
	s := spec
	s.StateDir = t.TempDir()
	s.Restore = &hypervisor.Restore{State: cf, Disks: saved.Disks, Resume: true}
	if err := launchExpectError(t, ctx, New(Config{}), s); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("restore of a truncated state = %v, want invalid argument", err)
	} else {
		t.Logf("truncated state: %v", err)
	}
	assertLeftOnly(t, s.StateDir)
	if pid := findQEMU(s.StateDir); pid != 0 {
		t.Errorf("qemu pid %d left running", pid)
	}
}

// TestRestoreBadState restores states that cannot load: each fails, and
// leaves no QEMU and no file behind.
func TestRestoreBadState(t *testing.T) {
	spec := agentSpec(t, 256)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	os.WriteFile(garbage, []byte("not a migration stream\n"), 0o600)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	for _, path := range []string{garbage, empty} {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		s := spec
		s.StateDir = t.TempDir()
		s.Restore = &hypervisor.Restore{State: f, Resume: true}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = launchExpectError(t, ctx, New(Config{}), s)
		cancel()
		f.Close()
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("restore of %s = %v, want invalid argument", filepath.Base(path), err)
		}
		t.Logf("%s: %v", filepath.Base(path), err)
		assertLeftOnly(t, s.StateDir)
		if pid := findQEMU(s.StateDir); pid != 0 {
			t.Errorf("qemu pid %d left running", pid)
		}
	}
	// A disk that is not there fails before QEMU starts.
	f, _ := os.Open(garbage)
	defer f.Close()
	s := spec
	s.StateDir = t.TempDir()
	s.Restore = &hypervisor.Restore{State: f, Disks: []hypervisor.Disk{{ID: "gone", Path: filepath.Join(dir, "gone.img")}}}
	if err := launchExpectError(t, context.Background(), New(Config{}), s); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("restore with a missing disk = %v, want not found", err)
	}
	assertLeftOnly(t, s.StateDir)
}

// guestTouchedKiB is how much of the guest's RAM QEMU holds: what the
// guest touched.
func guestTouchedKiB(t *testing.T, pid, guestMiB int) int {
	return smapsOf(t, pid, guestMiB).guestRSS
}
