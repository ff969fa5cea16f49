package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu/qmp"
)

var testShare = &hypervisor.Share{Tag: "cocoon-shared", Dir: "/run/cocoon/default/sb1/shared"}

// TestCommandLineShare: a share brings shareable RAM in a memfd (under
// the same backend id), virtio 1.0 transports, and the vhost-user socket
// and device, after the agent's devices and before the NICs.
func TestCommandLineShare(t *testing.T) {
	s := testSpec(hypervisor.AccelTCG, channel.Serial)
	s.Share = testShare
	s.NICs = testNICs(t, 1)
	p := nicParams(t, s, false)
	args := commandLine(p)
	for _, pair := range [][2]string{
		{"-M", "microvm,x-option-roms=off,rtc=on,acpi=off,memory-backend=mem"},
		{"-object", "memory-backend-memfd,id=mem,size=256M,share=on"},
		{"-global", "virtio-mmio.force-legacy=false"},
		{"-chardev", "socket,id=fs0,path=virtiofs.sock"},
		{"-device", "vhost-user-fs-device,chardev=fs0,tag=cocoon-shared,queue-size=1024"},
	} {
		if !hasPair(args, pair[0], pair[1]) {
			t.Errorf("no %s %s in %q", pair[0], pair[1], args)
		}
	}
	var devices []string
	for i, a := range args {
		if a == "-device" {
			devices = append(devices, strings.SplitN(args[i+1], ",", 2)[0])
		}
	}
	want := []string{"virtio-rng-device", "virtio-scsi-device", "virtio-serial-device", "virtserialport", "vhost-user-fs-device", "virtio-net-device"}
	if !slices.Equal(devices, want) {
		t.Errorf("devices %q, want %q", devices, want)
	}

	// Without a share nothing of it, and legacy transports as before.
	s.Share = nil
	for _, a := range commandLine(nicParams(t, s, false)) {
		if strings.Contains(a, "memfd") || strings.Contains(a, "force-legacy") || strings.Contains(a, "vhost-user-fs") {
			t.Errorf("argument %q without a share", a)
		}
	}
}

// TestCommandLineShareMemoryFile: a template's own VM (RAM in a shared
// file) keeps its file backend, which is shareable already.
func TestCommandLineShareMemoryFile(t *testing.T) {
	s := testSpec(hypervisor.AccelKVM, channel.Vsock)
	s.Share = testShare
	s.Memory = &hypervisor.MemoryFile{Path: "/var/lib/cocoon/templates/t/mem", Shared: true}
	args := commandLine(launchParams{spec: s, cid: 3})
	if !hasPair(args, "-object", "memory-backend-file,id=mem,size=256M,mem-path=/var/lib/cocoon/templates/t/mem,share=on") {
		t.Errorf("no shared file backend in %q", args)
	}
	if slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, "memfd") }) {
		t.Errorf("memfd with a memory file: %q", args)
	}
}

// TestVirtiofsdArgs pins virtiofsd's command line.
func TestVirtiofsdArgs(t *testing.T) {
	got := virtiofsdArgs(hypervisor.Share{Tag: "t", Dir: "/run/cocoon/ns/id/shared,dir"})
	want := []string{
		"--fd=3",
		"-o", "source=/run/cocoon/ns/id/shared,dir",
		"-o", "sandbox=namespace",
		"-o", "cache=auto",
		"-o", "announce_submounts",
		"-o", "no_posix_lock",
		"-o", "no_flock",
		"-o", "no_xattr",
		"-o", "modcaps=-mknod",
		"--thread-pool-size=0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("virtiofsd args:\n got %q\nwant %q", got, want)
	}
}

// TestValidateSpecShare: the tag and directory are checked, the share
// counts against microvm's transports, and what cannot work with one (a
// clone's private RAM, a restore) is refused as not implemented.
func TestValidateSpecShare(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinux")
	os.WriteFile(kernel, append([]byte("\x7fELF"), make([]byte, 100)...), 0o644)
	shared := filepath.Join(dir, "shared")
	os.Mkdir(shared, 0o700)
	good := hypervisor.Spec{ID: "x", StateDir: dir, Kernel: kernel, VCPUs: 1, MemoryMiB: 256,
		Accel: hypervisor.AccelKVM, Channel: channel.Vsock, NICs: testNICs(t, 4),
		Share: &hypervisor.Share{Tag: "cocoon-shared", Dir: shared}}
	if err := validateSpec(good); err != nil {
		t.Fatalf("a share and four nics: %v", err)
	}
	withShare := func(tag, dir string) func(*hypervisor.Spec) {
		return func(s *hypervisor.Spec) { s.Share = &hypervisor.Share{Tag: tag, Dir: dir} }
	}
	for _, tc := range []struct {
		name   string
		mutate func(*hypervisor.Spec)
		is     error
		want   string
	}{
		{"empty tag", withShare("", shared), errdefs.ErrInvalidArgument, `share tag ""`},
		{"long tag", withShare(strings.Repeat("t", 37), shared), errdefs.ErrInvalidArgument, "want 1-36 characters"},
		{"tag with a comma", withShare("a,b", shared), errdefs.ErrInvalidArgument, `share tag "a,b"`},
		{"relative dir", withShare("t", "shared"), errdefs.ErrInvalidArgument, "not an absolute path"},
		{"missing dir", withShare("t", filepath.Join(dir, "none")), errdefs.ErrInvalidArgument, "no such file"},
		{"file as dir", withShare("t", kernel), errdefs.ErrInvalidArgument, "is not a directory"},
		{"five nics", func(s *hypervisor.Spec) { s.NICs = testNICs(t, 5) }, errdefs.ErrInvalidArgument,
			"5 nics: microvm has 8 virtio-mmio transports and the guest's rng, scsi controller, agent channel and shared directory take 4, which leaves 4"},
		{"clone", func(s *hypervisor.Spec) { s.Memory = &hypervisor.MemoryFile{Path: kernel} }, errdefs.ErrNotImplemented, "templates with shares are not supported yet"},
		{"restore", func(s *hypervisor.Spec) {
			s.Restore = &hypervisor.Restore{State: testFile(t, dir, "state")}
		}, errdefs.ErrNotImplemented, "a restored vm cannot share host directories"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good
			s.NICs = slices.Clone(good.NICs)
			tc.mutate(&s)
			err := validateSpec(s)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %v mentioning %q", err, tc.is, tc.want)
			}
		})
	}
	s := good
	s.Memory = &hypervisor.MemoryFile{Path: filepath.Join(dir, "mem"), Shared: true}
	if err := validateSpec(s); err != nil {
		t.Errorf("a template's own vm with a share: %v", err)
	}
}

// TestMachineOfShare: the share is a device of the machine, between the
// agent's and the NICs, named by its tag.
func TestMachineOfShare(t *testing.T) {
	spec := testSpec(hypervisor.AccelKVM, channel.Serial)
	spec.Share = testShare
	spec.NICs = []hypervisor.NIC{{ID: "net0"}}
	want := []string{"virtio-rng", "virtio-scsi:scsi0", "agent:virtio-serial", "virtio-fs:cocoon-shared", "virtio-net:net0"}
	if got := machineOf(spec, qmp.Version{}).Devices; !slices.Equal(got, want) {
		t.Errorf("devices %q, want %q", got, want)
	}
}

// TestSaveRefusedWithShare: Save refuses a VM with a share before it
// asks QEMU anything.
func TestSaveRefusedWithShare(t *testing.T) {
	v := &VM{fs: &virtiofsd{}}
	_, err := v.Save(context.Background(), nil)
	if !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "shares host directories") {
		t.Fatalf("Save = %v, want ErrNotImplemented saying the sandbox shares host directories", err)
	}
}

func testLog(t *testing.T) *log.Entry {
	return log.G(context.Background()).WithField("test", t.Name())
}

// needVirtiofsd skips unless Debian's virtiofsd can run here: it needs
// root for its namespaces.
func needVirtiofsd(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("virtiofsd with sandbox=namespace needs root")
	}
	if _, err := os.Stat(DefaultVirtiofsd); err != nil {
		t.Skipf("no virtiofsd (apt-get install qemu-system-common): %v", err)
	}
	return DefaultVirtiofsd
}

// gone says whether pid has exited and been reaped (a zombie is not
// gone).
func gone(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return errors.Is(err, os.ErrNotExist)
}

// waitGone waits up to d for pid to be gone.
func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for !gone(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// waitEnviron waits up to a second for virtiofsd pid to show its
// environment: exec(2) lets its caller go before it has set up the new
// one, which /proc shows empty until then.
func waitEnviron(pid int, stateDir string) {
	for deadline := time.Now().Add(time.Second); !isOurVirtiofsd(pid, stateDir) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// shareSpec is a spec with a share of a new directory.
func shareSpec(t *testing.T) hypervisor.Spec {
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared")
	if err := os.Mkdir(shared, 0o700); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state-"+strings.Repeat("x", 120))
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	return hypervisor.Spec{ID: "fs", StateDir: state, Share: &hypervisor.Share{Tag: "t", Dir: shared}}
}

// TestVirtiofsdLifecycle runs the real virtiofsd without a VM: the socket
// is there at once, in a state dir longer than a socket path allows; a
// client's connection gets a worker; when the client goes the daemon ends
// by itself, and when it does not, stop ends it. Either way nothing is
// left running, not even a zombie, and only the log stays.
func TestVirtiofsdLifecycle(t *testing.T) {
	bin := needVirtiofsd(t)
	for _, clientStays := range []bool{false, true} {
		t.Run("client stays "+strconv.FormatBool(clientStays), func(t *testing.T) {
			spec := shareSpec(t)
			f, err := startVirtiofsd(testLog(t), bin, spec)
			if err != nil {
				t.Fatal(err)
			}
			pid := f.cmd.Process.Pid
			waitEnviron(pid, spec.StateDir)
			if !isOurVirtiofsd(pid, spec.StateDir) || isOurVirtiofsd(pid, spec.StateDir+"x") {
				t.Error("virtiofsd not recognized by its state dir")
			}
			if got := findVirtiofsd(spec.StateDir); !slices.Equal(got, []int{pid}) {
				t.Errorf("findVirtiofsd = %v, want [%d]", got, pid)
			}
			if p, err := readPIDFile(filepath.Join(spec.StateDir, VirtiofsdPIDFileName)); err != nil || p != pid {
				t.Errorf("pid file: %d, %v", p, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			conn, err := channel.DialUnix(ctx, filepath.Join(spec.StateDir, VirtiofsSocketName))
			if err != nil {
				t.Fatal(err)
			}
			var workers []int
			for deadline := time.Now().Add(5 * time.Second); len(workers) == 0 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
				workers = childrenOf(pid)
			}
			if len(workers) != 1 {
				t.Fatalf("workers after a connection: %v", workers)
			}
			if !clientStays {
				conn.Close()
				select {
				case <-f.exited:
				case <-time.After(5 * time.Second):
					t.Fatal("virtiofsd still runs after its client went")
				}
				if f.waitErr != nil {
					t.Errorf("virtiofsd exit after its client went: %v", f.waitErr)
				}
			} else {
				defer conn.Close()
			}
			start := time.Now()
			if err := f.stop(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("stop took %v", time.Since(start))
			if !gone(pid) || !waitGone(workers[0], 2*time.Second) {
				t.Errorf("left running: virtiofsd %d gone %v, worker %d gone %v", pid, gone(pid), workers[0], gone(workers[0]))
			}
			assertLeftOnly(t, spec.StateDir, VirtiofsdLogName)
			if err := f.stop(ctx); err != nil {
				t.Errorf("second stop: %v", err)
			}
		})
	}
}

// TestVirtiofsdStopUnconnected: a daemon QEMU never reached (a launch that
// failed before) is ended at once, not after the wait for a client.
func TestVirtiofsdStopUnconnected(t *testing.T) {
	bin := needVirtiofsd(t)
	spec := shareSpec(t)
	f, err := startVirtiofsd(testLog(t), bin, spec)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := f.stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > virtiofsdExitWait/2 {
		t.Errorf("stop took %v", d)
	}
	if !gone(f.cmd.Process.Pid) {
		t.Error("virtiofsd left running")
	}
	if err := f.failure(0); err != nil {
		t.Errorf("a daemon the driver stopped failed: %v", err)
	}
}

// TestCleanupVirtiofsd ends a virtiofsd no driver waits for, by its pid
// file or, without one, by a scan of /proc.
func TestCleanupVirtiofsd(t *testing.T) {
	bin := needVirtiofsd(t)
	for _, pidFile := range []bool{true, false} {
		t.Run("pid file "+strconv.FormatBool(pidFile), func(t *testing.T) {
			spec := shareSpec(t)
			f, err := startVirtiofsd(testLog(t), bin, spec)
			if err != nil {
				t.Fatal(err)
			}
			defer f.stop(context.Background())
			waitEnviron(f.cmd.Process.Pid, spec.StateDir)
			if !pidFile {
				os.Remove(filepath.Join(spec.StateDir, VirtiofsdPIDFileName))
			}
			if err := Cleanup(context.Background(), spec.StateDir); err != nil {
				t.Fatal(err)
			}
			select {
			case <-f.exited:
			case <-time.After(time.Second):
				t.Fatal("virtiofsd still runs after Cleanup")
			}
			assertLeftOnly(t, spec.StateDir, VirtiofsdLogName)
		})
	}
}

// fakeVirtiofsd is a virtiofsd that fails at once, saying why.
func fakeVirtiofsd(t *testing.T) string {
	t.Helper()
	script := filepath.Join(t.TempDir(), "virtiofsd")
	body := "#!/bin/sh\necho \"fake virtiofsd: source is not a directory\" >&2\nexit 1\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}

// TestVirtiofsdFailure: a daemon that exits with an error is a failure
// that names it and quotes its log, which is kept, capped, in the state
// dir.
func TestVirtiofsdFailure(t *testing.T) {
	spec := shareSpec(t)
	f, err := startVirtiofsd(testLog(t), fakeVirtiofsd(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	err = f.failure(5 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "exit status 1") || !strings.Contains(err.Error(), "virtiofsd log: fake virtiofsd: source is not a directory") {
		t.Fatalf("failure = %v", err)
	}
	if err := f.stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(spec.StateDir, VirtiofsdLogName))
	if string(data) != "fake virtiofsd: source is not a directory\n" {
		t.Errorf("virtiofsd.log = %q", data)
	}
}

// TestLaunchShareVirtiofsdFails: when virtiofsd dies, QEMU cannot reach
// it and Launch fails, with the daemon's log in the error, and leaves
// nothing behind.
func TestLaunchShareVirtiofsdFails(t *testing.T) {
	needQEMU(t)
	spec := shareSpec(t)
	kernel := filepath.Join(t.TempDir(), "vmlinux")
	os.WriteFile(kernel, append([]byte("\x7fELF"), make([]byte, 100)...), 0o644)
	spec.Kernel, spec.VCPUs, spec.MemoryMiB = kernel, 1, 64
	spec.Accel, spec.Channel = hypervisor.AccelTCG, channel.Serial
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := launchExpectError(t, ctx, New(Config{Virtiofsd: fakeVirtiofsd(t)}), spec)
	t.Log(err)
	if !strings.Contains(err.Error(), "virtiofsd log: fake virtiofsd: source is not a directory") {
		t.Errorf("launch error %v does not quote virtiofsd", err)
	}
	assertLeftOnly(t, spec.StateDir)
}

// TestLaunchShareWithoutVirtiofsd: a missing virtiofsd fails before
// anything starts, naming it.
func TestLaunchShareWithoutVirtiofsd(t *testing.T) {
	needQEMU(t)
	spec := shareSpec(t)
	kernel := filepath.Join(t.TempDir(), "vmlinux")
	os.WriteFile(kernel, append([]byte("\x7fELF"), make([]byte, 100)...), 0o644)
	spec.Kernel, spec.VCPUs, spec.MemoryMiB = kernel, 1, 64
	spec.Accel, spec.Channel = hypervisor.AccelTCG, channel.Serial
	missing := filepath.Join(t.TempDir(), "virtiofsd")
	err := launchExpectError(t, context.Background(), New(Config{Virtiofsd: missing}), spec)
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), missing) {
		t.Errorf("launch error %v, want ErrNotFound naming %s", err, missing)
	}
	assertLeftOnly(t, spec.StateDir)
}
