package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// ShimBinary is the shim's file name; containerd finds it on its PATH.
const ShimBinary = "containerd-shim-cocoon-v2"

var (
	buildOnce sync.Once
	builtDir  string
	buildErr  error
)

// ShimDir returns a directory holding the shim under test: $COCOON_BIN if
// it has one (make test-integration sets it to bin/), else a fresh build
// of this tree's shim and cocoon command, made once per test binary.
func ShimDir(t testing.TB) string {
	t.Helper()
	dir, err := FindShimDir()
	if err != nil {
		t.Fatalf("build the shim: %v", err)
	}
	return dir
}

// FindShimDir is ShimDir for programs that are not tests.
func FindShimDir() (string, error) {
	if d := os.Getenv("COCOON_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, ShimBinary)); err == nil {
			return d, nil
		}
	}
	buildOnce.Do(func() { builtDir, buildErr = buildShim() })
	return builtDir, buildErr
}

func buildShim() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	// One fixed directory, rebuilt by each test binary: nothing piles up.
	dir := filepath.Join(os.TempDir(), "cocoon-shim-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// The cocoon command too: the shim runs the one next to it to make
	// templates and spares, which must be of the same tree.
	for bin, pkg := range map[string]string{ShimBinary: "./cmd/containerd-shim-cocoon-v2", "cocoon": "./cmd/cocoon"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, bin), pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", &buildError{err: err, out: string(out)}
		}
	}
	return dir, nil
}

// moduleRoot is the directory of this module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }
