package qemu

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

// These tests start real QEMU processes under TCG. Those that need a guest
// kernel look for one in $COCOON_TEST_KERNEL, build/guest/vmlinux and
// /usr/local/share/cocoon/vmlinux, and skip, saying so, when none exists.

func needQEMU(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath(DefaultBinary); err != nil {
		t.Skipf("%s not on PATH (install qemu-system-x86): %v", DefaultBinary, err)
	}
}

func testKernel(t *testing.T) string {
	t.Helper()
	needQEMU(t)
	candidates := []string{os.Getenv("COCOON_TEST_KERNEL")}
	if root := moduleRoot(); root != "" {
		candidates = append(candidates, filepath.Join(root, "build", "guest", "vmlinux"))
	}
	candidates = append(candidates, "/usr/local/share/cocoon/vmlinux")
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() {
			return c
		}
	}
	t.Skip("no guest kernel: set COCOON_TEST_KERNEL (e.g. boot/vmlinuz-* from `apt-get download linux-image-6.1.0-*-cloud-amd64` unpacked with dpkg-deb -x), or run `make guest` to build build/guest/vmlinux")
	return ""
}

func moduleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

func baseSpec(t *testing.T, kernel string) hypervisor.Spec {
	return hypervisor.Spec{
		ID:        "test-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")),
		StateDir:  t.TempDir(),
		Kernel:    kernel,
		VCPUs:     1,
		MemoryMiB: 256,
		Accel:     hypervisor.AccelTCG,
		Channel:   channel.Serial,
	}
}

// launchForTest launches spec and registers a cleanup that stops the VM and
// checks nothing is left running.
func launchForTest(t *testing.T, spec hypervisor.Spec) *VM {
	t.Helper()
	return launchForTestWith(t, Config{}, spec)
}

// launchExpectError launches a spec that must fail; should it start, the VM
// is stopped so that no QEMU outlives the test.
func launchExpectError(t *testing.T, ctx context.Context, d *Driver, spec hypervisor.Spec) error {
	t.Helper()
	vm, err := d.Launch(ctx, spec)
	if err == nil {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		vm.Stop(sctx)
		t.Fatal("Launch succeeded")
	}
	return err
}

// assertLeftOnly fails unless dir holds exactly the named files.
func assertLeftOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("state dir holds %q, want %q", got, names)
	}
}

func waitExited(t *testing.T, vm *VM, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-vm.Exited():
		return time.Since(start)
	case <-time.After(d):
		t.Fatalf("qemu still running after %v; console:\n%s", d, strings.Join(vm.ConsoleTail(20), "\n"))
		return 0
	}
}

func TestLaunchMissingKernel(t *testing.T) {
	spec := baseSpec(t, "/nonexistent/cocoon/vmlinux")
	err := launchExpectError(t, context.Background(), New(Config{}), spec)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.Is(err, os.ErrNotExist) ||
		!strings.Contains(err.Error(), "/nonexistent/cocoon/vmlinux") {
		t.Fatalf("err = %v, want invalid argument naming the kernel path", err)
	}
	t.Logf("error: %v", err)
	assertLeftOnly(t, spec.StateDir)
	if pid := findQEMU(spec.StateDir); pid != 0 {
		t.Errorf("qemu pid %d runs", pid)
	}
}

func TestLaunchMissingBinary(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "vmlinux")
	os.WriteFile(kernel, []byte("\x7fELF"), 0o644)
	spec := baseSpec(t, kernel)
	err := launchExpectError(t, context.Background(), New(Config{Binary: "/nonexistent/qemu-system-x86_64"}), spec)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("err = %v, want not found", err)
	}
	assertLeftOnly(t, spec.StateDir)
}

func TestLaunchRandomBytesKernel(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "garbage")
	junk := make([]byte, 256<<10)
	rand.Read(junk)
	junk[0] = 0 // not ELF by chance
	os.WriteFile(kernel, junk, 0o644)
	spec := baseSpec(t, kernel)
	err := launchExpectError(t, context.Background(), New(Config{}), spec)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), kernel) {
		t.Fatalf("err = %v, want invalid argument naming the kernel", err)
	}
	t.Logf("error: %v", err)
	assertLeftOnly(t, spec.StateDir)
}

// TestLaunchGarbageKernel passes the format check (a bzImage magic in
// random bytes) so that QEMU itself rejects the kernel.
func TestLaunchGarbageKernel(t *testing.T) {
	needQEMU(t)
	dir := t.TempDir()
	kernel := filepath.Join(dir, "garbage")
	junk := make([]byte, 256<<10)
	rand.Read(junk)
	copy(junk[0x202:], "HdrS")
	junk[0x206], junk[0x207] = 0x00, 0x01 // boot protocol 1.00: too old for an initrd
	os.WriteFile(kernel, junk, 0o644)
	initrd := filepath.Join(dir, "initrd")
	os.WriteFile(initrd, []byte("initrd"), 0o644)
	spec := baseSpec(t, kernel)
	spec.Initrd = initrd
	start := time.Now()
	err := launchExpectError(t, context.Background(), New(Config{}), spec)
	t.Logf("error after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if !errors.Is(err, hypervisor.ErrVMExited) || !strings.Contains(err.Error(), "qemu stderr: qemu") ||
		!strings.Contains(err.Error(), "exited with status 1") {
		t.Errorf("err = %v, want QEMU's exit with its stderr", err)
	}
	assertLeftOnly(t, spec.StateDir)
	if pid := findQEMU(spec.StateDir); pid != 0 {
		t.Errorf("qemu pid %d runs", pid)
	}
}

func TestLaunchVsockWithoutDevice(t *testing.T) {
	if _, err := os.Stat(channel.VhostVsockDevice); err == nil {
		t.Skipf("%s exists here; this test covers hosts without it", channel.VhostVsockDevice)
	}
	kernel := filepath.Join(t.TempDir(), "vmlinux")
	os.WriteFile(kernel, []byte("\x7fELF"), 0o644)
	spec := baseSpec(t, kernel)
	spec.Channel = channel.Vsock
	err := launchExpectError(t, context.Background(), New(Config{}), spec)
	if err == nil || !strings.Contains(err.Error(), channel.VhostVsockDevice) {
		t.Fatalf("err = %v, want one naming %s", err, channel.VhostVsockDevice)
	}
	assertLeftOnly(t, spec.StateDir)
}

func TestLaunchStartDeadline(t *testing.T) {
	kernel := testKernel(t)
	spec := baseSpec(t, kernel)
	// A deadline too short for QEMU to come up: Launch must give up, kill
	// QEMU and leave nothing.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	err := launchExpectError(t, ctx, New(Config{}), spec)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	assertLeftOnly(t, spec.StateDir)
	if pid := findQEMU(spec.StateDir); pid != 0 {
		t.Errorf("qemu pid %d runs", pid)
	}
}

// TestKernelPanicWithoutInit boots a kernel with nowhere to mount root: it
// panics, panic=-1 resets, and -no-reboot ends QEMU.
func TestKernelPanicWithoutInit(t *testing.T) {
	spec := baseSpec(t, testKernel(t))
	spec.ConsoleLogBytes = 2 << 10
	vm := launchForTest(t, spec)

	if vm.AgentEndpoint().Kind != channel.Serial {
		t.Errorf("endpoint = %v", vm.AgentEndpoint())
	}
	// QEMU serves the agent socket from the start.
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	conn, err := vm.AgentEndpoint().Dial(dctx)
	cancel()
	if err != nil {
		t.Errorf("dial agent socket: %v", err)
	} else {
		conn.Close()
	}

	took := waitExited(t, vm, 90*time.Second)
	t.Logf("guest panicked and qemu exited %v after launch returned", took.Round(time.Millisecond))
	tail := strings.Join(vm.ConsoleTail(30), "\n")
	if !strings.Contains(tail, "Kernel panic") {
		t.Errorf("console tail has no kernel panic:\n%s", tail)
	}
	if err := vm.ExitError(); err != nil {
		t.Errorf("ExitError = %v, want nil for a reset under -no-reboot", err)
	}
	if r := vm.ShutdownReason(); r != "guest-reset" {
		t.Errorf("ShutdownReason = %q, want guest-reset", r)
	}
	if err := vm.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	assertLeftOnly(t, spec.StateDir, ConsoleLogName)
	log, _ := os.ReadFile(filepath.Join(spec.StateDir, ConsoleLogName))
	if len(log) > 2<<10 || !strings.HasSuffix(string(log), consoleTruncated) {
		t.Errorf("console.log is %d bytes, want capped at 2 KiB with the truncation line", len(log))
	}
}

// idleSpec is a guest that stays up: with panic=0 (later than the driver's
// panic=-1, so it wins) the kernel halts after its panic instead of
// resetting.
func idleSpec(t *testing.T) hypervisor.Spec {
	spec := baseSpec(t, testKernel(t))
	spec.KernelArgs = []string{"panic=0"}
	return spec
}

func TestExternalKillIsNoticed(t *testing.T) {
	spec := idleSpec(t)
	vm := launchForTest(t, spec)
	time.Sleep(200 * time.Millisecond)

	if err := syscall.Kill(vm.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := waitExited(t, vm, 5*time.Second)
	t.Logf("Exited closed %v after SIGKILL", took)
	if took > 500*time.Millisecond {
		t.Errorf("Exited took %v after SIGKILL", took)
	}
	err := vm.ExitError()
	if !errors.Is(err, hypervisor.ErrVMExited) || !strings.Contains(err.Error(), "killed") ||
		strings.Contains(err.Error(), "sent by the driver") {
		t.Errorf("ExitError = %v", err)
	}
	if err := vm.Stop(context.Background()); err != nil {
		t.Fatalf("Stop after kill: %v", err)
	}
	assertLeftOnly(t, spec.StateDir, ConsoleLogName)
	if err := vm.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestExternalSIGTERMIsAnError(t *testing.T) {
	spec := idleSpec(t)
	vm := launchForTest(t, spec)
	if err := syscall.Kill(vm.PID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExited(t, vm, 5*time.Second)
	err := vm.ExitError()
	// QEMU says on stderr who signalled it; under load it may exit
	// before that line is read, but the error must be there regardless.
	if !errors.Is(err, hypervisor.ErrVMExited) {
		t.Errorf("ExitError = %v, want a termination by another process with QEMU's stderr", err)
	}
	t.Logf("ExitError: %v", err)
}

func TestStopPausedGuestQuits(t *testing.T) {
	spec := idleSpec(t)
	vm := launchForTest(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := vm.QMP().Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := vm.QMP().QueryStatus(ctx); err != nil || st.Status != "paused" {
		t.Fatalf("status = %+v, %v", st, err)
	}
	start := time.Now()
	if err := vm.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	t.Logf("Stop of a paused guest took %v", time.Since(start).Round(time.Millisecond))
	if err := vm.ExitError(); err != nil {
		t.Errorf("ExitError after quit = %v", err)
	}
	if r := vm.ShutdownReason(); r != "host-qmp-quit" {
		t.Errorf("ShutdownReason = %q", r)
	}
	assertLeftOnly(t, spec.StateDir, ConsoleLogName)
}

// TestStopEscalates freezes QEMU with SIGSTOP so that neither quit nor
// SIGTERM is acted on: only SIGKILL ends it.
func TestStopEscalates(t *testing.T) {
	spec := idleSpec(t)
	vm := launchForTest(t, spec)
	if err := syscall.Kill(vm.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	if err := vm.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	took := time.Since(start)
	t.Logf("Stop escalated to SIGKILL in %v", took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Errorf("Stop took %v with a 2s deadline", took)
	}
	if err := vm.ExitError(); err == nil || !strings.Contains(err.Error(), "sent by the driver") {
		t.Errorf("ExitError = %v, want the driver's SIGKILL", err)
	}
	assertLeftOnly(t, spec.StateDir, ConsoleLogName)
}

func TestCleanupFromStateDirOnly(t *testing.T) {
	spec := idleSpec(t)
	vm := launchForTest(t, spec)

	// A live VM refuses a second launch in the same state dir.
	if err := launchExpectError(t, context.Background(), New(Config{}), spec); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Launch = %v, want already exists", err)
	}
	// Without its pid file, Cleanup still finds it.
	os.Remove(filepath.Join(spec.StateDir, PIDFileName))
	if err := Cleanup(context.Background(), spec.StateDir); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	waitExited(t, vm, 2*time.Second)
	assertLeftOnly(t, spec.StateDir, ConsoleLogName)
	if err := Cleanup(context.Background(), spec.StateDir); err != nil {
		t.Fatalf("second Cleanup: %v", err)
	}
}

// TestLongStateDir runs a VM in a state dir named after containerd's
// longest namespace and id (76 bytes each), where the socket paths are
// longer than a sockaddr_un holds: QMP and the agent's serial port answer,
// and both Stop and Cleanup (a `shim delete` that has only the state dir,
// here without the pid file) leave only the console log.
func TestLongStateDir(t *testing.T) {
	spec := idleSpec(t)
	spec.StateDir = filepath.Join(spec.StateDir, strings.Repeat("n", 76), strings.Repeat("i", 76))
	if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if p := filepath.Join(spec.StateDir, AgentSocketName); len(p) <= channel.MaxSocketPath {
		t.Fatalf("%s is short enough for a sockaddr_un: not a test of long paths", p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	vm := launchForTest(t, spec)
	if _, err := vm.QMP().QueryStatus(ctx); err != nil {
		t.Fatalf("qmp: %v", err)
	}
	conn, err := vm.AgentEndpoint().Dial(ctx)
	if err != nil {
		t.Fatalf("agent serial port: %v", err)
	}
	conn.Close()
	if Running(spec.StateDir) != vm.PID() {
		t.Errorf("Running(%s) = %d, want %d", spec.StateDir, Running(spec.StateDir), vm.PID())
	}
	if err := vm.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	assertLeftOnly(t, spec.StateDir, ConsoleLogName)

	vm = launchForTest(t, spec)
	os.Remove(filepath.Join(spec.StateDir, PIDFileName))
	if err := Cleanup(ctx, spec.StateDir); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	waitExited(t, vm, 2*time.Second)
	assertLeftOnly(t, spec.StateDir, ConsoleLogName)
}

func TestCleanupLeavesForeignPIDAlone(t *testing.T) {
	dir := t.TempDir()
	sleeper := exec.Command("sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	os.WriteFile(filepath.Join(dir, PIDFileName), []byte(strconv.Itoa(sleeper.Process.Pid)), 0o600)
	if err := Cleanup(context.Background(), dir); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if err := sleeper.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("Cleanup killed a process that is not our qemu: %v", err)
	}
	assertLeftOnly(t, dir)
}

// TestMeasure reports launch-to-QMP time and QEMU's memory with an idle
// guest; it asserts only what the design budgets.
func TestMeasure(t *testing.T) {
	spec := idleSpec(t)
	start := time.Now()
	vm := launchForTest(t, spec)
	t.Logf("launch to qmp ready: %v", time.Since(start).Round(time.Millisecond))
	time.Sleep(5 * time.Second) // let the guest boot and settle
	rss, anonOutside := memoryOf(t, vm.PID(), spec.MemoryMiB)
	t.Logf("qemu rss %d MiB; anonymous memory outside guest ram %d MiB (tb-size %d MiB)", rss>>10, anonOutside>>10, DefaultTBSizeMiB)
}

// qemuSmaps is what a QEMU's /proc/<pid>/smaps says, in KiB: its RSS
// and anonymous memory, and the RSS and anonymous memory of the guest RAM
// mapping (the one of the guest's size).
type qemuSmaps struct{ rss, anon, guestRSS, guestAnon int }

func smapsOf(t *testing.T, pid, guestMiB int) qemuSmaps {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var m qemuSmaps
	var size int
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.Atoi(f[1])
		guest := size == guestMiB<<10
		switch f[0] {
		case "Size:":
			size = n
		case "Rss:":
			m.rss += n
			if guest {
				m.guestRSS += n
			}
		case "Anonymous:":
			m.anon += n
			if guest {
				m.guestAnon += n
			}
		}
	}
	return m
}

// memoryOf returns QEMU's RSS and its anonymous resident memory outside the
// guest RAM mapping, in KiB.
func memoryOf(t *testing.T, pid, guestMiB int) (rss, anonOutside int) {
	m := smapsOf(t, pid, guestMiB)
	return m.rss, m.anon - m.guestAnon
}
