package main

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

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/cocoonrt/cocoon/runtime/admin"
	"github.com/cocoonrt/cocoon/runtime/checkpoint"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// templateEnv points the configuration at temporary directories, a
// guest image of which only the manifest is real and a QEMU binary that
// is never run, and returns the Env the cocoon command will load.
func templateEnv(t *testing.T) *admin.Env {
	t.Helper()
	dir := t.TempDir()
	manifest := fmt.Sprintf(`{"schema": 1, "kernel": {"path": "vmlinux", "sha256": %q, "release": "6.1.0-test"}, "initrd": {"path": "initrd.img", "sha256": %q}}`,
		strings.Repeat("a", 64), strings.Repeat("b", 64))
	os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(manifest), 0o644)
	os.WriteFile(filepath.Join(dir, "qemu"), []byte("#!/bin/false\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "config.toml"), nil, 0o644)
	t.Setenv("COCOON_CONFIG", filepath.Join(dir, "config.toml"))
	t.Setenv("COCOON_IMAGE_DIR", dir)
	t.Setenv("COCOON_QEMU", filepath.Join(dir, "qemu"))
	t.Setenv("COCOON_DATA_DIR", filepath.Join(dir, "data"))
	t.Setenv("COCOON_STATE_DIR", filepath.Join(dir, "state"))
	t.Setenv("COCOON_MEMORY_MIB", "64")
	env, err := admin.LoadEnv("")
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// createTemplate makes the template of the configured shape with a build
// that boots nothing.
func createTemplate(t *testing.T, env *admin.Env) *template.Template {
	t.Helper()
	shape, err := env.CurrentShape()
	if err != nil {
		t.Fatal(err)
	}
	tpl, _, err := env.Templates().Create(context.Background(), shape, template.CreateOptions{}, func(ctx context.Context, b template.Build) (template.Built, error) {
		err := os.WriteFile(b.State, []byte("state"), 0o600)
		return template.Built{Machine: checkpoint.Machine{Driver: shape.Driver, DriverVersion: "7.2.19", VCPUs: shape.VCPUs, MemoryMiB: shape.MemoryMiB}}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

// runTemplate runs `cocoon template` with args and returns what it
// printed.
func runTemplate(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := &cli.App{Name: "cocoon", Writer: &out, ErrWriter: &out, Commands: []*cli.Command{templateCommand()}}
	err := app.Run(append([]string{"cocoon", "template"}, args...))
	return out.String(), err
}

func TestTemplateUsage(t *testing.T) {
	templateEnv(t)
	for _, args := range [][]string{
		{"ls", "x"}, {"rm"}, {"rm", "--all", strings.Repeat("a", 32)}, {"inspect"}, {"inspect", "a", "b"},
	} {
		if _, err := runTemplate(t, args...); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "usage:") {
			t.Errorf("template %q: %v, want a usage error", args, err)
		}
	}
}

func TestTemplateCommands(t *testing.T) {
	env := templateEnv(t)
	tpl := createTemplate(t, env)

	out, err := runTemplate(t, "ls")
	if err != nil || !strings.Contains(out, "*  "+tpl.Key()+"  1 ") || !strings.HasSuffix(out, "* the template of the current configuration's shape\n") {
		t.Errorf("ls: %v\n%s", err, out)
	}

	out, err = runTemplate(t, "inspect", "--verify", tpl.Key())
	if err != nil || !strings.Contains(out, "key:             "+tpl.Key()) || !strings.HasSuffix(out, "verified: ok (sizes and sha256 digests)\n") {
		t.Errorf("inspect --verify: %v\n%s", err, out)
	}
	out, err = runTemplate(t, "inspect", "--json", tpl.Key())
	var m template.Manifest
	if err != nil || json.Unmarshal([]byte(out), &m) != nil || m.Key != tpl.Key() {
		t.Errorf("inspect --json: %v\n%s", err, out)
	}
	os.WriteFile(filepath.Join(tpl.Dir, template.StateName), []byte("STATE"), 0o600)
	if out, err = runTemplate(t, "inspect", "--verify", tpl.Key()); !errors.Is(err, template.ErrStale) || !strings.Contains(out, "verified: failed: vm.state: sha256 is") {
		t.Errorf("inspect --verify of a changed template: %v\n%s", err, out)
	}

	if out, err = runTemplate(t, "rm", tpl.Key()); err != nil || out != "removed template "+tpl.Key()+"\n" {
		t.Errorf("rm: %v\n%s", err, out)
	}
	if _, err = runTemplate(t, "rm", tpl.Key()); !errdefs.IsNotFound(err) {
		t.Errorf("rm of a removed template: %v", err)
	}
	createTemplate(t, env)
	if out, err = runTemplate(t, "rm", "--all"); err != nil || out != "removed template "+tpl.Key()+"\n" {
		t.Errorf("rm --all: %v\n%s", err, out)
	}
}
