package sandbox

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/agent"
)

// startServing starts a sandbox on a fake VM whose guest serves, with a
// process running in it, and returns the sandbox, its VM and the
// process.
func startServing(t *testing.T) (*Sandbox, *fakeVM, *agent.Process) {
	t.Helper()
	d := &fakeDriver{mode: guestServes}
	sb, err := Start(context.Background(), testOptions(t, d))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Stop(context.Background()) })
	p, err := sb.Agent().Start(context.Background(), agent.ProcessSpec{ID: "long", Args: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	return sb, d.launched[0], p
}

// waitDead waits for the sandbox to be declared dead.
func waitDead(t *testing.T, sb *Sandbox) error {
	t.Helper()
	select {
	case <-sb.Dead():
	case <-time.After(5 * time.Second):
		t.Fatal("the sandbox was not declared dead")
	}
	p, cause := sb.Phase()
	if p != PhaseDead {
		t.Fatalf("phase %s, want dead", p)
	}
	return cause
}

// checkAfterDeath: waits end, calls are refused naming the death, and
// Stop still cleans up.
func checkAfterDeath(t *testing.T, sb *Sandbox, p *agent.Process, vm *fakeVM) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.Wait(ctx); !errdefs.IsUnavailable(err) {
		t.Errorf("wait for a process of a dead sandbox: %v, want unavailable", err)
	}
	if err := sb.StartContainer(ctx, "c1"); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "the sandbox's VM is gone") {
		t.Errorf("call on a dead sandbox: %v", err)
	}
	if !vm.stopped {
		t.Error("the VM of a dead sandbox was not ended")
	}
	if err := sb.Stop(ctx); err != nil {
		t.Fatalf("stop a dead sandbox: %v", err)
	}
	if _, err := os.Stat(sb.Dir); !os.IsNotExist(err) {
		t.Errorf("state dir left: %v", err)
	}
	if ph, _ := sb.Phase(); ph != PhaseStopped {
		t.Errorf("phase after stop: %s", ph)
	}
}

// TestVMExitsAfterBoot: a VMM that exits while the sandbox is ready makes
// it dead, with the VMM's exit as the cause.
func TestVMExitsAfterBoot(t *testing.T) {
	sb, vm, p := startServing(t)
	vm.exit(errors.New("qemu killed by signal 9"))
	if cause := waitDead(t, sb); cause == nil || !strings.Contains(cause.Error(), "signal 9") {
		t.Errorf("cause %v", cause)
	}
	checkAfterDeath(t, sb, p, vm)
}

// TestGuestSendsGarbage: a guest that writes what is no frame of the
// session has its session dropped and its VM ended; the host goes on.
func TestGuestSendsGarbage(t *testing.T) {
	sb, vm, p := startServing(t)
	if err := vm.sendGarbage(); err != nil {
		t.Fatal(err)
	}
	if cause := waitDead(t, sb); cause == nil || !strings.Contains(cause.Error(), "session ended") {
		t.Errorf("cause %v", cause)
	}
	checkAfterDeath(t, sb, p, vm)
}

// TestStopIsNotDeath: a VM that exits because Stop ended it does not
// make the sandbox dead.
func TestStopIsNotDeath(t *testing.T) {
	sb, _, _ := startServing(t)
	if err := sb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Dead():
		t.Fatal("a stopped sandbox was declared dead")
	default:
	}
}
