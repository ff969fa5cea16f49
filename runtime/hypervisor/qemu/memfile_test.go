package qemu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

// TestMemoryFileClones: a guest booted with its RAM in a shared file is
// saved without its RAM (the file is the memory), and two clones restored
// from that state map the file privately, copy-on-write: both answer a new
// agent session, from the saved uptime on, and leave the file as it was.
// The base of templates.
func TestMemoryFileClones(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	dir := t.TempDir()
	mem := filepath.Join(dir, "mem")
	spec := agentSpec(t, 256)
	spec.Memory = &hypervisor.MemoryFile{Path: mem, Shared: true}
	tmpl := launchForTest(t, spec)
	_, info := connectAgent(t, ctx, tmpl)
	state := filepath.Join(dir, "vm.state")
	saved, took := saveTo(t, ctx, tmpl, state)
	fi, err := os.Stat(mem)
	if err != nil || fi.Size() != 256<<20 {
		t.Fatalf("memory file: %v, %d bytes", err, fi.Size())
	}
	t.Logf("template: pause+save %v, state %d KiB (RAM left out), memory file %d KiB allocated",
		took.Round(time.Millisecond), saved.Bytes>>10, allocatedKiB(t, mem))
	if saved.Bytes > 4<<20 {
		t.Errorf("the state of a VM with RAM in a shared file holds %d bytes: RAM was not left out", saved.Bytes)
	}
	if err := tmpl.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	before := allocatedKiB(t, mem)
	for i := 0; i < 2; i++ {
		clone := spec
		clone.Memory = &hypervisor.MemoryFile{Path: mem}
		start := time.Now()
		vm, running := restoreFrom(t, clone, state, saved.Disks)
		_, cinfo := connectAgent(t, ctx, vm)
		t.Logf("clone %d: running %v after launch, agent answered %v after launch; uptime %v (template saved at %v)",
			i, running.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), cinfo.Uptime, info.Uptime)
		if cinfo.Uptime < info.Uptime {
			t.Errorf("clone %d rebooted: uptime %v", i, cinfo.Uptime)
		}
		if err := vm.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if after := allocatedKiB(t, mem); after != before {
		t.Errorf("the clones wrote the template's memory file: %d KiB allocated, was %d", after, before)
	}
}
