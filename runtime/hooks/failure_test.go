package hooks

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

func TestFailureCarriesStatusAndOutput(t *testing.T) {
	dir := t.TempDir()
	ok := specs.Hook{Path: script(t, dir, "ok", "exit 0")}
	bad := specs.Hook{Path: script(t, dir, "bad", "echo to stdout; echo to stderr >&2; exit 3")}
	err := Run(context.Background(), CreateRuntime, []specs.Hook{ok, bad}, testState(dir))
	if err == nil {
		t.Fatal("a failing hook did not fail Run")
	}
	msg := err.Error()
	for _, want := range []string{"createRuntime hook 1", strconv.Quote(bad.Path), "exit status 3", "to stdout\nto stderr"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("error %q is not a failed precondition", msg)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Errorf("error %q does not wrap the exit status 3", msg)
	}
}

func TestOutputBounded(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	h := specs.Hook{Path: script(t, dir, "hook", "/bin/cat "+big+"; echo; echo the last words >&2; exit 1")}
	err := Run(context.Background(), Prestart, []specs.Hook{h}, testState(dir))
	if err == nil {
		t.Fatal("a failing hook did not fail Run")
	}
	msg := err.Error()
	if len(msg) > outputMax+512 {
		t.Errorf("error is %d bytes long, want at most the output's %d and a line", len(msg), outputMax)
	}
	if !strings.HasSuffix(msg, "xxx\nthe last words") {
		t.Errorf("error does not end with the hook's last output: ...%q", msg[max(0, len(msg)-64):])
	}
	if !strings.Contains(msg, "exit status 1; output (its last 4096 bytes): xxx") {
		t.Errorf("error does not say its output was cut: %q...", msg[:min(len(msg), 200)])
	}
}

func TestMissingBinary(t *testing.T) {
	dir := t.TempDir()
	h := specs.Hook{Path: filepath.Join(dir, "no-such-hook")}
	err := Run(context.Background(), CreateRuntime, []specs.Hook{h}, testState(dir))
	if err == nil {
		t.Fatal("a missing hook binary did not fail Run")
	}
	if !strings.Contains(err.Error(), "could not start") || !errors.Is(err, fs.ErrNotExist) || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("error %q does not say the binary is missing", err)
	}
}

func TestTimeoutKillsGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	body := "/bin/sleep 30 &\necho $! > " + pidFile + "\necho started\n/bin/sleep 30"
	h := specs.Hook{Path: script(t, dir, "hook", body), Timeout: seconds(1)}
	start := time.Now()
	err := Run(context.Background(), CreateRuntime, []specs.Hook{h}, testState(dir))
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("a hook with a 1s timeout took %s to stop", took)
	}
	if err == nil {
		t.Fatal("a hook past its timeout did not fail Run")
	}
	msg := err.Error()
	if !strings.Contains(msg, "timed out after 1s") || !strings.HasSuffix(msg, "started") {
		t.Errorf("error %q does not say it timed out, with the output", msg)
	}
	if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("error %q is not a failed precondition", msg)
	}
	waitGone(t, readPid(t, pidFile))
}

func TestContextCancelKillsGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	body := "/bin/sleep 30 &\necho $! > " + pidFile + "\n/bin/sleep 30"
	h := specs.Hook{Path: script(t, dir, "hook", body)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	err := Run(ctx, CreateRuntime, []specs.Hook{h}, testState(dir))
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("a cancelled hook took %s to stop", took)
	}
	if !errors.Is(err, context.Canceled) || errdefs.IsFailedPrecondition(err) {
		t.Fatalf("error %v is not the context's, alone", err)
	}
	waitGone(t, readPid(t, pidFile))

	// A context already done runs nothing.
	marker := filepath.Join(dir, "ran")
	later := specs.Hook{Path: script(t, dir, "later", "echo > "+marker)}
	if err := Run(ctx, CreateRuntime, []specs.Hook{later}, testState(dir)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run under a done context: %v", err)
	}
	if exists(marker) {
		t.Fatal("a hook ran under a done context")
	}
}

func TestOutputHeldOpenAfterSuccess(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	// The sleep keeps the hook's stdout open after the hook exits.
	h := specs.Hook{Path: script(t, dir, "hook", "/bin/sleep 30 &\necho $! > "+pidFile)}
	start := time.Now()
	if err := Run(context.Background(), CreateRuntime, []specs.Hook{h}, testState(dir)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > outputGrace+2*time.Second {
		t.Errorf("Run waited %s on output held open by a hook's child", took)
	}
	pid := readPid(t, pidFile)
	_ = unix.Kill(pid, unix.SIGKILL)
	waitGone(t, pid)
}
