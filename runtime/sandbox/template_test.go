package sandbox

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// snapDriver is a fakeDriver whose VMs can be planned, saved and
// restored: a restore checks the machine and records the spec.
type snapDriver struct {
	fakeDriver
	machine hypervisor.Machine
	specs   []hypervisor.Spec
}

func (d *snapDriver) Plan(spec hypervisor.Spec) (hypervisor.Plan, error) {
	return hypervisor.Plan{Driver: "fake", VMM: "/fake/vmm", VMMID: "1", Type: d.machine.Type, Devices: d.machine.Devices}, nil
}

func (d *snapDriver) Launch(ctx context.Context, spec hypervisor.Spec) (hypervisor.VM, error) {
	d.mu.Lock()
	d.specs = append(d.specs, spec)
	d.mu.Unlock()
	if r := spec.Restore; r != nil && r.Check != nil {
		if err := r.Check(d.machine); err != nil {
			return nil, err
		}
	}
	vm, err := d.fakeDriver.Launch(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &snapVM{fakeVM: vm.(*fakeVM), machine: d.machine}, nil
}

type snapVM struct {
	*fakeVM
	machine hypervisor.Machine
}

func (v *snapVM) Pause(context.Context) error  { return nil }
func (v *snapVM) Resume(context.Context) error { return nil }
func (v *snapVM) Save(_ context.Context, w *os.File) (hypervisor.SavedState, error) {
	n, err := w.WriteString("saved state")
	return hypervisor.SavedState{Bytes: int64(n)}, err
}
func (v *snapVM) Machine() hypervisor.Machine { return v.machine }

func templateOptions(t *testing.T) (Options, *snapDriver, *template.Store) {
	d := &snapDriver{machine: hypervisor.Machine{Driver: "fake", Version: "1.0", Type: "microvm", Devices: []string{"agent:virtio-serial"}}}
	o := testOptions(t, &d.fakeDriver)
	o.Driver = d
	o.Config.Hypervisor.MemoryMiB = config.MinMemoryMiB
	// The fake binds the agent socket by its full path, which the
	// template sandbox's long id would take past 108 bytes.
	run, err := os.MkdirTemp("", "sb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	o.Config.Runtime.StateDir = run
	return o, d, template.Open(o.Config.Runtime.DataDir)
}

// TestStartWithTemplate: never boots; auto boots while there is no
// template and says it is missing; required fails then, naming the way
// out; with a template, auto and required start from it, its memory
// mapped privately and its state restored; a template whose VMM is not
// the one that runs is passed over in auto and fatal in required.
func TestStartWithTemplate(t *testing.T) {
	ctx := context.Background()
	o, d, store := templateOptions(t)
	start := func(mode string) (TemplateUse, error) {
		t.Helper()
		o := o
		o.Config.Template.Mode = mode
		sb, use, err := StartWithTemplate(ctx, o, store)
		if err == nil {
			if sb.Template != "" != use.Used {
				t.Errorf("%s: sandbox template %q, use %+v", mode, sb.Template, use)
			}
			if err := sb.Stop(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return use, err
	}
	if use, err := start(config.TemplateNever); err != nil || use.Used || use.Missing {
		t.Fatalf("never: %+v, %v", use, err)
	}
	use, err := start(config.TemplateAuto)
	if err != nil || use.Used || !use.Missing || use.Key == "" {
		t.Fatalf("auto without a template: %+v, %v", use, err)
	}
	if _, err := start(config.TemplateRequired); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "cocoon template create") {
		t.Fatalf("required without a template: %v", err)
	}

	tm, created, err := MakeTemplate(ctx, o, store, template.CreateOptions{})
	if err != nil || !created {
		t.Fatalf("make template: %v, %v", created, err)
	}
	if tm.Key() != use.Key {
		t.Fatalf("template key %s, the sandbox's shape is %s", tm.Key(), use.Key)
	}
	if got := tm.Manifest.Machine.DriverVersion; got != "1.0" {
		t.Errorf("template machine version %q", got)
	}
	made := d.specs[len(d.specs)-1]
	if made.Memory == nil || !made.Memory.Shared || made.Restore != nil {
		t.Fatalf("template VM spec: memory %+v, restore %v", made.Memory, made.Restore)
	}
	for _, mode := range []string{config.TemplateAuto, config.TemplateRequired} {
		use, err := start(mode)
		if err != nil || !use.Used {
			t.Fatalf("%s with a template: %+v, %v", mode, use, err)
		}
		clone := d.specs[len(d.specs)-1]
		if clone.Memory == nil || clone.Memory.Shared || clone.Memory.Path != tm.MemoryPath() || clone.Restore == nil {
			t.Fatalf("%s: clone spec: memory %+v, restore %v", mode, clone.Memory, clone.Restore)
		}
	}

	d.machine.Version = "2.0"
	if use, err := start(config.TemplateAuto); err != nil || use.Used || !strings.Contains(use.Why, "1.0") {
		t.Fatalf("auto with a template of another VMM version: %+v, %v", use, err)
	}
	// The template that cannot start here is gone; required now fails
	// for want of one.
	if _, err := store.Lookup(tm.Manifest.Shape); !errdefs.IsNotFound(err) {
		t.Fatalf("the template that could not start is still there: %v", err)
	}
	if _, _, err := MakeTemplate(ctx, o, store, template.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d.machine.Version = "3.0"
	if _, err := start(config.TemplateRequired); !errors.Is(err, template.ErrStale) {
		t.Fatalf("required with a template of another VMM version: %v", err)
	}
	for _, vm := range d.launched {
		if !vm.stopped && vm.exitErr == nil {
			select {
			case <-vm.exited:
			default:
				t.Error("a VM was left running")
			}
		}
	}
}

// A sandbox that joins a network namespace has no template to start
// from (its NICs would have to be in one): required refuses it, naming
// the namespace, and auto says why it boots and makes none.
func TestTemplateRefusesNetworkNamespace(t *testing.T) {
	o, _, _ := templateOptions(t)
	o.NetNS = "/var/run/netns/cni-test"
	_, err := ShapeOf(o)
	if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "/var/run/netns/cni-test") {
		t.Fatalf("ShapeOf: %v", err)
	}
	o.Config.Template.Mode = config.TemplateRequired
	if _, _, err := StartWithTemplate(context.Background(), o, nil); err == nil || !strings.Contains(err.Error(), "network namespace") {
		t.Fatalf("required: %v", err)
	}
}
