package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

// detachForTest detaches vm and moves its state directory to a new one,
// as a spare's claimer does, returning the handoff, its files and the
// new directory.
func detachForTest(t *testing.T, vm *VM) (hypervisor.Handoff, []*os.File, string) {
	t.Helper()
	h, files, err := vm.Detach()
	if err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if len(files) != handoffFiles || h.PID != vm.PID() || h.Name != nameArg(vm.stateDir) || h.Endpoint.SocketPath != AgentSocketName {
		t.Fatalf("Detach = %+v with %d files", h, len(files))
	}
	dir := filepath.Join(t.TempDir(), "taken")
	if err := os.Rename(h.StateDir, dir); err != nil {
		t.Fatal(err)
	}
	return h, files, dir
}

// TestDetachAdopt hands a running VM from one driver to another, as a
// spare is handed to the sandbox that claims it: the adopter drives QMP,
// reads the guest console, notices an external kill through the pidfd
// and stops it, and Cleanup knows the VM by its state directory's name
// file although QEMU's -name is the old directory's.
func TestDetachAdopt(t *testing.T) {
	spec := idleSpec(t)
	old := launchForTest(t, spec)
	// The console has its first lines before the handover: the adopter
	// appends to the same log.
	waitConsole(t, old, regexp.MustCompile(`Linux version`), 30*time.Second)
	h, files, dir := detachForTest(t, old)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := New(Config{}).Adopt(ctx, h, files, dir)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	vm := got.(*VM)
	if vm.PID() != h.PID || vm.AgentEndpoint().SocketPath != filepath.Join(dir, AgentSocketName) || vm.Machine().Version != h.Machine.Version {
		t.Errorf("adopted vm: pid %d, endpoint %v, machine %+v; handoff %+v", vm.PID(), vm.AgentEndpoint(), vm.Machine(), h)
	}
	if err := vm.Pause(ctx); err != nil {
		t.Errorf("Pause over the adopter's QMP: %v", err)
	}
	if err := vm.Resume(ctx); err != nil {
		t.Errorf("Resume over the adopter's QMP: %v", err)
	}
	if pid := Running(dir); pid != h.PID {
		t.Errorf("Running(%s) = %d, want the adopted qemu %d", dir, pid, h.PID)
	}
	if data, err := os.ReadFile(filepath.Join(dir, ConsoleLogName)); err != nil || !strings.Contains(string(data), "Linux version") {
		t.Errorf("console log after the handover: %v\n%s", err, data)
	}

	if err := syscall.Kill(h.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := waitExited(t, vm, 5*time.Second)
	t.Logf("the adopter saw the exit %v after SIGKILL", took)
	if err := vm.ExitError(); !errors.Is(err, hypervisor.ErrVMExited) {
		t.Errorf("ExitError after an external kill = %v", err)
	}
	if err := vm.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	assertLeftOnly(t, dir, ConsoleLogName)
}

// TestAdoptedCleanup: a shim that adopted a VM and died leaves its state
// directory; Cleanup of that directory ends the VM.
func TestAdoptedCleanup(t *testing.T) {
	spec := idleSpec(t)
	old := launchForTest(t, spec)
	h, files, dir := detachForTest(t, old)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	vm, err := New(Config{}).Adopt(ctx, h, files, dir)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if err := Cleanup(ctx, dir); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	select {
	case <-vm.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("qemu still runs after Cleanup of the adopter's state directory")
	}
	if _, err := os.Stat(filepath.Join(dir, NameFileName)); !os.IsNotExist(err) {
		t.Errorf("%s after Cleanup: %v", NameFileName, err)
	}
}

// TestAdoptRefusesAnotherProcess: a handoff whose pid is not the pidfd's
// process, whose name is not that QEMU's or whose driver is another is
// refused, and the VM is left running.
func TestAdoptRefusesAnotherProcess(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*hypervisor.Handoff)
	}{
		{"another pid", func(h *hypervisor.Handoff) { h.PID = os.Getpid() }},
		{"another name", func(h *hypervisor.Handoff) { h.Name = "guest=/elsewhere" }},
		{"another driver", func(h *hypervisor.Handoff) { h.Driver = "other" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := launchForTest(t, idleSpec(t))
			h, files, err := old.Detach()
			if err != nil {
				t.Fatalf("Detach: %v", err)
			}
			tc.edit(&h)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := New(Config{}).Adopt(ctx, h, files, t.TempDir()); !errdefs.IsInvalidArgument(err) {
				t.Errorf("Adopt = %v, want invalid argument", err)
			}
			time.Sleep(100 * time.Millisecond)
			select {
			case <-old.Exited():
				t.Error("a refused Adopt ended the VM")
			default:
			}
		})
	}
}
