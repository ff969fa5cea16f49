package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/checkpoint"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// testEnv is an Env over temporary directories, a guest image of which
// only the manifest is real and a QEMU binary that is never run: enough
// for shapes and templates, not for VMs. Its guest has the least memory
// the configuration allows, so that memory files are small.
func testEnv(t *testing.T) *Env {
	t.Helper()
	dir := t.TempDir()
	imageDir := filepath.Join(dir, "image")
	os.Mkdir(imageDir, 0o755)
	manifest := fmt.Sprintf(`{"schema": 1,
		"kernel": {"path": "vmlinux", "sha256": %q, "version": "6.1.0", "release": "6.1.0-test", "cmdline": "console=hvc0 quiet"},
		"initrd": {"path": "initrd.img", "sha256": %q, "compression": "lz4"}}`, strings.Repeat("a", 64), strings.Repeat("b", 64))
	if err := os.WriteFile(filepath.Join(imageDir, "manifest.json"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	qemuBin := filepath.Join(dir, "qemu-system-x86_64")
	if err := os.WriteFile(qemuBin, []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Hypervisor.Path = qemuBin
	cfg.Hypervisor.MemoryMiB = config.MinMemoryMiB
	cfg.Guest.ImageDir = imageDir
	cfg.Runtime.DataDir = filepath.Join(dir, "data")
	cfg.Runtime.StateDir = filepath.Join(dir, "state")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return &Env{
		Config:      cfg,
		AccelHost:   hypervisor.AccelHost{KVMDevice: errors.New("no /dev/kvm in tests")},
		ChannelHost: channel.Host{VhostVsock: func() error { return errors.New("no vsock in tests") }},
	}
}

// currentShape is the shape of e's configuration.
func currentShape(t *testing.T, e *Env) template.Shape {
	t.Helper()
	s, err := e.CurrentShape()
	if err != nil {
		t.Fatalf("current shape: %v", err)
	}
	return s
}

// otherShape is a shape of 1 MiB of memory, not the current one.
func otherShape(t *testing.T, e *Env, vcpus int) template.Shape {
	s := currentShape(t, e)
	s.VCPUs, s.MemoryMiB = vcpus, 1
	return s
}

// makeTemplate creates the template of shape in e's store with a build
// that boots nothing: it writes into the memory and state files.
func makeTemplate(t *testing.T, e *Env, shape template.Shape) *template.Template {
	t.Helper()
	build := func(ctx context.Context, b template.Build) (template.Built, error) {
		f, err := os.OpenFile(b.Memory, os.O_WRONLY, 0)
		if err != nil {
			return template.Built{}, err
		}
		f.WriteAt([]byte("guest RAM"), 8192)
		f.Close()
		if err := os.WriteFile(b.State, []byte("device state"), 0o600); err != nil {
			return template.Built{}, err
		}
		return template.Built{
			Machine: checkpoint.Machine{
				Driver: shape.Driver, DriverVersion: "7.2.19", MachineType: shape.MachineType, VCPUs: shape.VCPUs,
				MemoryMiB: shape.MemoryMiB, Accel: shape.Accel, Channel: shape.Channel, KernelArgs: shape.KernelArgs, Devices: shape.Devices,
			},
			Boot: 1234 * time.Millisecond, Save: 56 * time.Millisecond,
		}, nil
	}
	tpl, created, err := e.Templates().Create(context.Background(), shape, template.CreateOptions{}, build)
	if err != nil || !created {
		t.Fatalf("create template: created %v, %v", created, err)
	}
	return tpl
}

// writeFailure records a failed creation of key.
func writeFailure(t *testing.T, e *Env, key, msg string) {
	t.Helper()
	data, _ := json.Marshal(template.Failure{Time: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC), Error: msg})
	os.MkdirAll(e.Templates().Dir(), 0o700)
	if err := os.WriteFile(filepath.Join(e.Templates().Dir(), key+".failed"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// corrupt changes a byte of the template's memory file.
func corrupt(t *testing.T, tpl *template.Template) {
	t.Helper()
	f, err := os.OpenFile(tpl.MemoryPath(), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{1}, 0)
	f.Close()
}

// line returns the line of out that contains key, failing if none does.
func line(t *testing.T, out, key string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, key) {
			return l
		}
	}
	t.Fatalf("no line has %s:\n%s", key, out)
	return ""
}

func TestListTemplates(t *testing.T) {
	e := testEnv(t)
	var out bytes.Buffer
	if err := e.ListTemplates(&out); err != nil {
		t.Fatal(err)
	}
	cur := currentShape(t, e)
	want := "  KEY  VCPUS  MEMORY  ACCEL  CHANNEL  GUEST  CREATED  DISK  STATUS\n" +
		"the current configuration's shape (key " + cur.Key() + ") has no template: `cocoon template create` makes it\n"
	if out.String() != want {
		t.Errorf("ls of an empty store:\n%s\nwant\n%s", out.String(), want)
	}

	makeTemplate(t, e, cur)
	changed := makeTemplate(t, e, otherShape(t, e, 2))
	corrupt(t, changed)
	writeFailure(t, e, changed.Key(), "boot the template's guest:\nconsole tail:\n\x1b[31m[ 1.0] oops")
	broken := makeTemplate(t, e, otherShape(t, e, 3))
	os.WriteFile(filepath.Join(broken.Dir, template.ManifestName), []byte(`{"format": 9}`), 0o600)
	lonely := strings.Repeat("f", 32)
	writeFailure(t, e, lonely, "the guest did not boot")

	out.Reset()
	if err := e.ListTemplates(&out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	failedAt := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC).Local().Format(time.RFC3339)
	l := line(t, got, cur.Key())
	f := strings.Fields(l)
	if !strings.HasPrefix(l, "*  "+cur.Key()) || len(f) != 12 || strings.Join(f[:8], " ") != "* "+cur.Key()+" 1 64 MiB tcg serial 6.1.0-test" ||
		f[10] != "KiB" || f[11] != "ok" {
		t.Errorf("the current template's line: %q", l)
	} else if created, err := time.Parse(time.RFC3339, f[8]); err != nil || time.Since(created) > time.Minute {
		t.Errorf("the current template's line: created %q, %v", f[8], err)
	}
	if l := line(t, got, changed.Key()); strings.HasPrefix(l, "*") ||
		!strings.HasPrefix(strings.Join(strings.Fields(l), " "), changed.Key()+" 2 1 MiB tcg serial 6.1.0-test ") ||
		!strings.HasSuffix(l, "ok, files changed since last verified; failed creation at "+failedAt+
			": boot the template's guest: console tail: ?[31m[ 1.0] oops") {
		t.Errorf("the changed template's line: %q", l)
	}
	if l := line(t, got, broken.Key()); !strings.HasPrefix(strings.Join(strings.Fields(l), " "), broken.Key()+" - - - - - - ") ||
		!strings.HasSuffix(l, "KiB  unreadable: template.json: format 9, this version reads 1") {
		t.Errorf("the broken template's line: %q", l)
	}
	if l := line(t, got, lonely); strings.Join(strings.Fields(l), " ") != lonely+" - - - - - - - failed creation at "+failedAt+": the guest did not boot" {
		t.Errorf("the failure's line: %q", l)
	}
	if !strings.HasSuffix(got, "\n* the template of the current configuration's shape\n") {
		t.Errorf("ls does not end with what * means:\n%s", got)
	}
	if n := strings.Count(got, "\n"); n != 6 {
		t.Errorf("ls printed %d lines, want a header, 4 rows and a note:\n%s", n, got)
	}
}

// The failure of the current shape's creation has the shape's columns.
func TestListTemplatesCurrentFailed(t *testing.T) {
	e := testEnv(t)
	cur := currentShape(t, e)
	writeFailure(t, e, cur.Key(), "boom")
	var out bytes.Buffer
	if err := e.ListTemplates(&out); err != nil {
		t.Fatal(err)
	}
	if l := line(t, out.String(), cur.Key()); strings.Join(strings.Fields(l), " ") !=
		"* "+cur.Key()+" 1 64 MiB tcg serial 6.1.0-test - - failed creation at "+time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC).Local().Format(time.RFC3339)+": boom" {
		t.Errorf("the failure's line: %q", l)
	}
	if !strings.Contains(out.String(), "has no template") {
		t.Errorf("ls says the current shape has a template:\n%s", out.String())
	}
}

func TestListTemplatesNoImage(t *testing.T) {
	e := testEnv(t)
	makeTemplate(t, e, otherShape(t, e, 2))
	e.Config.Guest.ImageDir = t.TempDir()
	e.Config.Template.Mode = config.TemplateNever
	var out bytes.Buffer
	if err := e.ListTemplates(&out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if strings.Contains(got, "*") || !strings.Contains(got, "the current configuration's shape is unknown: guest image: ") ||
		!strings.HasSuffix(got, "template.mode is never: sandboxes boot, whatever templates there are\n") {
		t.Errorf("ls with no guest image:\n%s", got)
	}
}

func TestRemoveTemplates(t *testing.T) {
	e := testEnv(t)
	a := makeTemplate(t, e, otherShape(t, e, 2))
	b := makeTemplate(t, e, otherShape(t, e, 3))
	lonely := strings.Repeat("e", 32)
	writeFailure(t, e, lonely, "boom")
	var out bytes.Buffer

	// A bad key removes nothing.
	if err := e.RemoveTemplates(&out, []string{a.Key(), "nope"}, false); !errdefs.IsInvalidArgument(err) || out.Len() != 0 {
		t.Errorf("rm with a bad key: %v, printed %q", err, out.String())
	}
	if err := e.RemoveTemplates(&out, nil, false); !errdefs.IsInvalidArgument(err) {
		t.Errorf("rm of nothing: %v", err)
	}
	if err := e.RemoveTemplates(&out, []string{a.Key()}, true); !errdefs.IsInvalidArgument(err) {
		t.Errorf("rm of a key and --all: %v", err)
	}
	// A key that is not there does not keep the others.
	missing := strings.Repeat("0", 32)
	err := e.RemoveTemplates(&out, []string{missing, a.Key(), lonely}, false)
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), missing) {
		t.Errorf("rm of a missing key: %v", err)
	}
	if want := "removed template " + a.Key() + "\nremoved the record of a failed creation of template " + lonely + "\n"; out.String() != want {
		t.Errorf("rm printed %q, want %q", out.String(), want)
	}
	if _, err := e.Templates().Load(a.Key()); !errdefs.IsNotFound(err) {
		t.Errorf("the template is still there: %v", err)
	}

	writeFailure(t, e, b.Key(), "boom")
	writeFailure(t, e, lonely, "boom")
	out.Reset()
	if err := e.RemoveTemplates(&out, nil, true); err != nil {
		t.Fatalf("rm --all: %v", err)
	}
	// --all goes in key order, and b's key is its shape's, which the
	// test's fake QEMU binary changes on every run.
	want := "removed template " + b.Key() + "\nremoved the record of a failed creation of template " + lonely + "\n"
	if b.Key() > lonely {
		want = "removed the record of a failed creation of template " + lonely + "\nremoved template " + b.Key() + "\n"
	}
	if out.String() != want {
		t.Errorf("rm --all printed %q, want %q", out.String(), want)
	}
	if list, _ := e.Templates().List(); len(list) != 0 {
		t.Errorf("templates after rm --all: %+v", list)
	}
	if f, _ := e.Templates().Failures(); len(f) != 0 {
		t.Errorf("failure records after rm --all: %+v", f)
	}
	out.Reset()
	if err := e.RemoveTemplates(&out, nil, true); err != nil || !strings.HasPrefix(out.String(), "no templates in ") {
		t.Errorf("rm --all of an empty store: %v, printed %q", err, out.String())
	}
}

func TestInspectTemplate(t *testing.T) {
	e := testEnv(t)
	cur := currentShape(t, e)
	tpl := makeTemplate(t, e, cur)
	var out bytes.Buffer
	if err := e.InspectTemplate(&out, tpl.Key(), InspectOptions{}); err != nil {
		t.Fatalf("inspect: %v\n%s", err, out.String())
	}
	var mem checkpoint.File
	for _, f := range tpl.Manifest.Files {
		if f.Name == template.MemoryName {
			mem = f
		}
	}
	for _, want := range []string{
		"key:             " + tpl.Key() + "\n",
		"directory:       " + tpl.Dir + "\n",
		"current:         yes",
		"guest ready in:  1234 ms",
		"saved in:        56 ms",
		"machine:         qemu 7.2.19, microvm, 1 vCPUs, 64 MiB, accel tcg, channel serial\n",
		"  vmm:           " + e.Config.Hypervisor.Path + " (dev=",
		"  devices:       virtio-rng virtio-scsi:scsi0 agent:virtio-serial\n",
		"  memory:        64 MiB\n",
		"  kernel args:   console=hvc0 quiet\n",
		"  guest image:   6.1.0-test, kernel sha256:aaaa",
		"files: 2\n",
		"  vm.state  12 bytes",
		"  memory    67108864 bytes (64.0 MiB)  ",
		" on disk  sha256 " + mem.SHA256 + "\n",
		"verified: files unchanged since their digests were checked",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("inspect does not print %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	if err := e.InspectTemplate(&out, tpl.Key(), InspectOptions{Verify: true}); err != nil || !strings.HasSuffix(out.String(), "verified: ok (sizes and sha256 digests)\n") {
		t.Errorf("inspect --verify: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := e.InspectTemplate(&out, tpl.Key(), InspectOptions{JSON: true}); err != nil {
		t.Fatal(err)
	}
	var m template.Manifest
	if err := json.Unmarshal(out.Bytes(), &m); err != nil || m.Key != tpl.Key() || !m.Shape.Equal(cur) {
		t.Errorf("inspect --json: %v\n%s", err, out.String())
	}

	corrupt(t, tpl)
	writeFailure(t, e, tpl.Key(), "boom")
	out.Reset()
	err := e.InspectTemplate(&out, tpl.Key(), InspectOptions{Verify: true})
	if !errors.Is(err, template.ErrStale) || !strings.Contains(out.String(), "failed creation at ") ||
		!strings.Contains(out.String(), "\nverified: failed: memory: sha256 is ") {
		t.Errorf("inspect --verify of a corrupt template: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := e.InspectTemplate(&out, tpl.Key(), InspectOptions{JSON: true, Verify: true}); !errors.Is(err, template.ErrStale) || json.Unmarshal(out.Bytes(), &m) != nil {
		t.Errorf("inspect --json --verify of a corrupt template: %v\n%s", err, out.String())
	}
}

func TestInspectTemplateMissing(t *testing.T) {
	e := testEnv(t)
	var out bytes.Buffer
	if err := e.InspectTemplate(&out, "x", InspectOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("inspect of a bad key: %v", err)
	}
	key := strings.Repeat("d", 32)
	if err := e.InspectTemplate(&out, key, InspectOptions{}); !errdefs.IsNotFound(err) || out.Len() != 0 {
		t.Errorf("inspect of a missing key: %v, printed %q", err, out.String())
	}
	writeFailure(t, e, key, "line one\nline two")
	if err := e.InspectTemplate(&out, key, InspectOptions{}); !errdefs.IsNotFound(err) ||
		out.String() != "failed creation at "+time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC).Local().Format(time.RFC3339)+": line one line two\n" {
		t.Errorf("inspect of a failed creation: %v, printed %q", err, out.String())
	}
}

func TestGCTemplates(t *testing.T) {
	e := testEnv(t)
	var out bytes.Buffer
	if err := e.GCTemplates(context.Background(), &out); err != nil || out.String() != "templates "+e.Templates().Dir()+": none\n" {
		t.Errorf("gc of no store: %v, printed %q", err, out.String())
	}

	cur := currentShape(t, e)
	makeTemplate(t, e, cur)
	oldGuest := otherShape(t, e, 2)
	oldGuest.Guest.Version, oldGuest.Guest.Kernel = "6.1.0-old", "sha256:"+strings.Repeat("c", 64)
	makeTemplate(t, e, oldGuest)
	oldVMM := otherShape(t, e, 3)
	oldVMM.VMMID = "dev=0,ino=0,size=0,mtime=0"
	makeTemplate(t, e, oldVMM)
	bad := makeTemplate(t, e, otherShape(t, e, 4))
	corrupt(t, bad)
	writeFailure(t, e, cur.Key(), "boom")

	// With no guest image to go by, nothing is removed.
	imageDir := e.Config.Guest.ImageDir
	e.Config.Guest.ImageDir = t.TempDir()
	out.Reset()
	if err := e.GCTemplates(context.Background(), &out); err != nil || !strings.Contains(out.String(), ": kept, none removed: no guest image") {
		t.Errorf("gc with no guest image: %v, printed %q", err, out.String())
	}
	if list, _ := e.Templates().List(); len(list) != 4 {
		t.Errorf("gc with no guest image left %d templates", len(list))
	}

	e.Config.Guest.ImageDir = imageDir
	out.Reset()
	if err := e.GCTemplates(context.Background(), &out); err != nil {
		t.Fatalf("gc: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"removed template " + oldGuest.Key() + " (made for guest image 6.1.0-old kernel sha256:cccc",
		"removed template " + oldVMM.Key() + " (made with VMM " + e.Config.Hypervisor.Path + " (dev=0,ino=0,size=0,mtime=0), the installed one is",
		"removed template " + bad.Key() + " (memory: sha256 is ",
		"removed " + filepath.Join(e.Templates().Dir(), cur.Key()+".failed") + " (record of a failed creation)\n",
		"templates " + e.Templates().Dir() + ": removed 4, freed ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("gc does not print %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, cur.Key()+" (") || strings.Contains(got, "stale or corrupt") {
		t.Errorf("gc printed:\n%s", got)
	}
	if _, err := e.Templates().Lookup(cur); err != nil {
		t.Errorf("gc removed the current template: %v", err)
	}

	// A VMM that cannot be found keeps templates of every VMM.
	makeTemplate(t, e, oldVMM)
	e.Config.Hypervisor.Path = filepath.Join(t.TempDir(), "no-qemu")
	out.Reset()
	if err := e.GCTemplates(context.Background(), &out); err != nil || !strings.Contains(out.String(), "the VMM is unknown, templates of every VMM are kept") ||
		!strings.HasSuffix(out.String(), ": removed 0, freed 0 B\n") {
		t.Errorf("gc with no VMM: %v, printed %q", err, out.String())
	}
}
