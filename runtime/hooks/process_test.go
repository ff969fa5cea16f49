package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestStateOnStdin(t *testing.T) {
	dir := t.TempDir()
	got := filepath.Join(dir, "state.json")
	h := specs.Hook{Path: script(t, dir, "hook", "/bin/cat > "+got)}
	want := testState(dir)
	if err := Run(context.Background(), CreateRuntime, []specs.Hook{h}, want); err != nil {
		t.Fatal(err)
	}
	var st specs.State
	if err := json.Unmarshal([]byte(readFile(t, got)), &st); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("hook read state %+v, want %+v", st, want)
	}
}

func TestArgv(t *testing.T) {
	dir := t.TempDir()
	got := filepath.Join(dir, "cmdline")
	// /bin/sh itself is the hook, so that its argv[0] is the one given (a
	// script's interpreter gets the script's path instead).
	args := []string{"argv-zero", "-c", "/bin/cat /proc/$$/cmdline > " + got, "one", "two words"}
	h := specs.Hook{Path: "/bin/sh", Args: args}
	if err := Run(context.Background(), Prestart, []specs.Hook{h}, testState(dir)); err != nil {
		t.Fatal(err)
	}
	argv := strings.Split(strings.TrimSuffix(readFile(t, got), "\x00"), "\x00")
	if !reflect.DeepEqual(argv, args) {
		t.Fatalf("hook's argv is %q, want %q", argv, args)
	}
}

func TestCommandDefaults(t *testing.T) {
	cmd := command(context.Background(), specs.Hook{Path: "/bin/true"}, nil, "", newTail(outputMax))
	if !reflect.DeepEqual(cmd.Args, []string{"/bin/true"}) {
		t.Errorf("argv without Args is %q, want [/bin/true]", cmd.Args)
	}
	if cmd.Env == nil || len(cmd.Env) != 0 {
		t.Errorf("environment without Env is %q (nil: %v), want empty, not inherited", cmd.Env, cmd.Env == nil)
	}
	if cmd.Dir != "/" {
		t.Errorf("working directory without a bundle is %q, want /", cmd.Dir)
	}
	if cmd.ExtraFiles != nil {
		t.Errorf("hook is given descriptors %v", cmd.ExtraFiles)
	}
}

func TestEnvIsExactlyHookEnv(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("COCOON_SHIM_ONLY", "leak")
	for _, env := range [][]string{{"A=1", "B=two words", "PATH=/nowhere"}, nil} {
		got := filepath.Join(dir, "environ")
		h := specs.Hook{Path: script(t, dir, "hook", "/bin/cat /proc/$$/environ > "+got), Env: env}
		if err := Run(context.Background(), CreateRuntime, []specs.Hook{h}, testState(dir)); err != nil {
			t.Fatal(err)
		}
		raw := strings.TrimSuffix(readFile(t, got), "\x00")
		var seen []string
		if raw != "" {
			seen = strings.Split(raw, "\x00")
		}
		if len(seen) != len(env) || (len(env) > 0 && !reflect.DeepEqual(seen, env)) {
			t.Errorf("hook's environment is %q, want %q", seen, env)
		}
	}
}

func TestWorkingDirectory(t *testing.T) {
	dir := t.TempDir()
	bundle, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := filepath.Join(dir, "cwd")
	h := specs.Hook{Path: script(t, dir, "hook", "pwd -P > "+got)}
	for bundle, want := range map[string]string{bundle: bundle, filepath.Join(bundle, "missing"): "/", "": "/"} {
		if err := Run(context.Background(), CreateContainer, []specs.Hook{h}, testState(bundle)); err != nil {
			t.Fatal(err)
		}
		if cwd := strings.TrimSpace(readFile(t, got)); cwd != want {
			t.Errorf("bundle %q: hook ran in %q, want %q", bundle, cwd, want)
		}
	}
}

func TestNoDescriptorsOfTheShim(t *testing.T) {
	dir := t.TempDir()
	opened, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer opened.Close()
	// The hook is sleep itself, not a shell (which keeps descriptors of its
	// own), and is looked at from here while it sleeps.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := specs.Hook{Path: "/bin/sleep", Args: []string{"hook-sleep", "30"}}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, CreateRuntime, []specs.Hook{h}, testState(dir)) }()
	pid := waitChild(t, "sleep")
	entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled hook: %v", err)
	}
	// Besides stdio, the hook may have only what this process was itself
	// given without close-on-exec (what its parent leaked), as exec would
	// pass to any child; nothing this process opened.
	allowed := inheritable(t)
	var fds []int
	for _, e := range entries {
		fd, _ := strconv.Atoi(e.Name())
		fds = append(fds, fd)
		if fd > 2 && !allowed[fd] {
			t.Errorf("hook has descriptor %d of the shim's (the one opened here is %d)", fd, opened.Fd())
		}
	}
	for fd := range 3 {
		if !slices.Contains(fds, fd) {
			t.Errorf("hook has no descriptor %d: %v", fd, fds)
		}
	}
}
