package hooks

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestRunStopsAtFirstFailure(t *testing.T) {
	dir := t.TempDir()
	first, third := filepath.Join(dir, "first-ran"), filepath.Join(dir, "third-ran")
	hooks := []specs.Hook{
		{Path: script(t, dir, "first", "echo > "+first)},
		{Path: script(t, dir, "second", "exit 1")},
		{Path: script(t, dir, "third", "echo > "+third)},
	}
	err := Run(context.Background(), CreateRuntime, hooks, testState(dir))
	if err == nil || !strings.Contains(err.Error(), "createRuntime hook 1 ") {
		t.Fatalf("error %v does not name hook 1", err)
	}
	if !exists(first) {
		t.Error("the hook before the failing one did not run")
	}
	if exists(third) {
		t.Error("the hook after the failing one ran")
	}
}

func TestRunAllRunsEveryHook(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	hooks := []specs.Hook{
		{Path: script(t, dir, "first", "echo first failed; exit 1")},
		{Path: "relative/hook"},
		{Path: script(t, dir, "third", "echo > "+marker)},
		{Path: script(t, dir, "fourth", "exit 2")},
	}
	err := RunAll(context.Background(), Poststop, hooks, testState(dir))
	if !exists(marker) {
		t.Error("a hook after failing ones did not run")
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("error %v is not joined", err)
	}
	errs := joined.Unwrap()
	wants := []string{"poststop hook 0", "poststop hook 1", "poststop hook 3"}
	if len(errs) != len(wants) {
		t.Fatalf("got %d errors (%v), want %d", len(errs), err, len(wants))
	}
	for i, want := range wants {
		if !strings.HasPrefix(errs[i].Error(), want) {
			t.Errorf("error %d is %q, want it to start with %q", i, errs[i], want)
		}
	}
	if !strings.Contains(errs[0].Error(), "exit status 1; output: first failed") || !errdefs.IsInvalidArgument(errs[1]) || !strings.Contains(errs[2].Error(), "exit status 2") {
		t.Errorf("errors do not say how each hook failed: %v", err)
	}
	if err := RunAll(context.Background(), Poststart, nil, testState(dir)); err != nil {
		t.Errorf("RunAll of no hooks: %v", err)
	}
}

func TestBadDefinitionsRefused(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	ok := specs.Hook{Path: script(t, dir, "ok", "echo > "+marker)}
	for _, bad := range []specs.Hook{
		{Path: "bin/hook"},
		{Path: ""},
		{Path: ok.Path, Timeout: seconds(0)},
		{Path: ok.Path, Timeout: seconds(-1)},
	} {
		err := Run(context.Background(), CreateRuntime, []specs.Hook{ok, bad}, testState(dir))
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("hook %+v: error %v is not an invalid argument", bad, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), "createRuntime hook 1 "+strconv.Quote(bad.Path)+": ") {
			t.Errorf("error %q does not name the hook", err)
		}
		if exists(marker) {
			t.Fatal("a hook ran though a later one of its list is badly defined")
		}
		if err := Validate(&specs.Hooks{Poststop: []specs.Hook{ok, bad}}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Validate of %+v: %v", bad, err)
		}
	}
	if err := Validate(&specs.Hooks{CreateRuntime: []specs.Hook{ok}, Poststop: []specs.Hook{{Path: "/x", Timeout: seconds(1)}}}); err != nil {
		t.Errorf("Validate of good hooks: %v", err)
	}
	if err := Validate(nil); err != nil {
		t.Errorf("Validate of no hooks: %v", err)
	}
}

func TestOf(t *testing.T) {
	h := &specs.Hooks{
		Prestart:        []specs.Hook{{Path: "/prestart"}},
		CreateRuntime:   []specs.Hook{{Path: "/createRuntime"}},
		CreateContainer: []specs.Hook{{Path: "/createContainer"}},
		StartContainer:  []specs.Hook{{Path: "/startContainer"}},
		Poststart:       []specs.Hook{{Path: "/poststart"}},
		Poststop:        []specs.Hook{{Path: "/poststop"}},
	}
	for _, k := range []Kind{Prestart, CreateRuntime, CreateContainer, Poststart, Poststop} {
		if got := Of(h, k); len(got) != 1 || got[0].Path != "/"+string(k) {
			t.Errorf("Of(%s) = %v", k, got)
		}
		if got := Of(nil, k); got != nil {
			t.Errorf("Of(nil, %s) = %v", k, got)
		}
	}
	if got := Of(h, "startContainer"); got != nil {
		t.Errorf("Of(startContainer) = %v, want nil: it runs in the guest", got)
	}
}
