package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/cocoonrt/cocoon/runtime/checkpoint"
)

// writeCheckpoint makes a small valid checkpoint directory.
func writeCheckpoint(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	w, err := checkpoint.NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := w.Add(checkpoint.StateName)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("the migration stream")
	f.Close()
	sha := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	m := &checkpoint.Manifest{
		Namespace: "default", SandboxID: "sb1",
		Machine: checkpoint.Machine{Driver: "qemu", DriverVersion: "7.2.19", MachineType: "microvm", VCPUs: 1, MemoryMiB: 256,
			Accel: "tcg", Channel: "vsock", KernelArgs: []string{"console=hvc0"}, Devices: []string{"virtio-scsi"}},
		Guest:      checkpoint.GuestImage{Version: "6.1.0", Kernel: sha("a"), Initrd: sha("b")},
		State:      checkpoint.StateName,
		Disks:      []checkpoint.Disk{{ID: "c1-layer-0", ReadOnly: true, Role: checkpoint.RoleLayer, Container: "c1", Digest: sha("c")}},
		Containers: []checkpoint.Container{{ID: "c1", Processes: []checkpoint.Process{{GuestID: "p1", Pid: 1, Stdout: true}}}},
	}
	if err := w.Finish(m); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runCocoon runs the cocoon command's checkpoint verbs with args and
// returns what they printed.
func runCocoon(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := &cli.App{Name: "cocoon", Writer: &out, ErrWriter: &out, Commands: []*cli.Command{checkpointCommand()}}
	err := app.Run(append([]string{"cocoon"}, args...))
	return out.String(), err
}

func TestCheckpointInspect(t *testing.T) {
	dir := writeCheckpoint(t)
	out, err := runCocoon(t, "checkpoint", "inspect", dir)
	if err != nil {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	for _, want := range []string{
		"format:       2", "sandbox:      default/sb1", "machine:      qemu 7.2.19, microvm, 1 vCPUs, 256 MiB, accel tcg, channel vsock",
		"containers: 1", "  c1: 1 process\n    init  guest p1  pid 1  stdout\n",
		"c1-layer-0  scsi 0:0  layer  read-only  container c1  sha256:ccc",
		"vm.state  20 bytes  sha256 ", "total: 20 bytes in 1 file and the manifest", "verified: ok",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect does not print %q:\n%s", want, out)
		}
	}
}

func TestCheckpointInspectJSON(t *testing.T) {
	dir := writeCheckpoint(t)
	out, err := runCocoon(t, "checkpoint", "inspect", "--json", dir)
	if err != nil {
		t.Fatalf("inspect --json: %v\n%s", err, out)
	}
	var m checkpoint.Manifest
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("inspect --json printed no manifest: %v\n%s", err, out)
	}
	if m.SandboxID != "sb1" || len(m.Files) != 1 {
		t.Errorf("inspect --json printed %+v", m)
	}
}

func TestCheckpointInspectTampered(t *testing.T) {
	dir := writeCheckpoint(t)
	if err := os.WriteFile(filepath.Join(dir, checkpoint.StateName), []byte("the migration streaM"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runCocoon(t, "checkpoint", "inspect", dir)
	if !errors.Is(err, checkpoint.ErrInvalid) || !strings.Contains(err.Error(), `file "vm.state": sha256 is`) {
		t.Errorf("inspect of a tampered checkpoint: %v", err)
	}
	if !strings.Contains(out, "sandbox:      default/sb1") || !strings.Contains(out, "verified: failed") || strings.Contains(out, "verified: ok") {
		t.Errorf("inspect of a tampered checkpoint printed:\n%s", out)
	}
	out, err = runCocoon(t, "checkpoint", "inspect", "--json", dir)
	if !errors.Is(err, checkpoint.ErrInvalid) || !strings.Contains(out, `"sandbox_id": "sb1"`) {
		t.Errorf("inspect --json of a tampered checkpoint: %v\n%s", err, out)
	}

	os.WriteFile(filepath.Join(dir, checkpoint.ManifestName), []byte("{"), 0o600)
	out, err = runCocoon(t, "checkpoint", "inspect", dir)
	if !errors.Is(err, checkpoint.ErrInvalid) || out != "" {
		t.Errorf("inspect of an unreadable manifest: %v, printed %q", err, out)
	}
}

func TestCheckpointInspectUsage(t *testing.T) {
	for _, args := range [][]string{{}, {"a", "b"}} {
		if _, err := runCocoon(t, append([]string{"checkpoint", "inspect"}, args...)...); err == nil || !strings.Contains(err.Error(), "usage:") {
			t.Errorf("inspect %v: %v, want a usage error", args, err)
		}
	}
}
