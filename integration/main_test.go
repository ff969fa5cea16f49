// Package integration boots real microVMs with real QEMU and drives them
// the way users do: through the cocoon command and the runtime packages.
// It needs root and a built guest image (COCOON_IMAGE_DIR, set by
// `make test-integration`).
package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// env is what every test needs; filled once by TestMain.
type env struct {
	// imageDir holds the guest image under test.
	imageDir string
	// bin holds the cocoon binaries under test.
	bin string
}

var testEnv env

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("integration tests need root (they start QEMU, make state under /run); run `make test` as root")
		os.Exit(1)
	}
	testEnv.imageDir = os.Getenv("COCOON_IMAGE_DIR")
	testEnv.bin = os.Getenv("COCOON_BIN")
	if testEnv.imageDir == "" || testEnv.bin == "" {
		fmt.Println("COCOON_IMAGE_DIR and COCOON_BIN must be set; run through `make test-integration`")
		os.Exit(1)
	}
	if _, err := os.Stat(filepath.Join(testEnv.imageDir, "manifest.json")); err != nil {
		fmt.Println("no guest image:", err, "(run `make guest`)")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// stateRoot gives a test its own state and data directories and checks,
// when the test ends, that nothing is left in them and no QEMU of theirs
// still runs.
func stateRoot(t *testing.T) (stateDir, dataDir string) {
	t.Helper()
	root := t.TempDir()
	stateDir = filepath.Join(root, "run")
	dataDir = filepath.Join(root, "lib")
	// An empty config file: the host's /etc/cocoon/config.toml must not
	// change what the tests see.
	if err := os.WriteFile(filepath.Join(root, "config.toml"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("COCOON_CONFIG", filepath.Join(root, "config.toml"))
	// Sandboxes boot unless the test says otherwise (see shimContainerd).
	if os.Getenv("COCOON_TEMPLATE") == "" {
		t.Setenv("COCOON_TEMPLATE", "never")
	}
	if os.Getenv("COCOON_TEMPLATE_SPARE") == "" {
		t.Setenv("COCOON_TEMPLATE_SPARE", "false")
	}
	t.Cleanup(func() { assertClean(t, stateDir) })
	return stateDir, dataDir
}

// assertClean fails t if a sandbox state directory or a QEMU process that
// belongs to stateDir remains.
func assertClean(t *testing.T, stateDir string) {
	t.Helper()
	for _, proc := range []string{"qemu-system", "virtiofsd"} {
		if out, err := exec.Command("pgrep", "-a", "-f", proc+".*"+stateDir).Output(); err == nil {
			t.Errorf("%s still running after the test:\n%s", proc, out)
		}
	}
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mounts), stateDir+"/") {
		var left []string
		for _, l := range strings.Split(string(mounts), "\n") {
			if strings.Contains(l, stateDir+"/") {
				left = append(left, l)
			}
		}
		t.Errorf("mounts left under the state directory:\n%s", strings.Join(left, "\n"))
	}
	var left []string
	filepath.WalkDir(stateDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != stateDir && strings.Count(strings.TrimPrefix(p, stateDir), "/") >= 2 {
			left = append(left, p)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("sandbox state left behind: %v", left)
	}
}

// cocoon returns the cocoon command with the test's environment.
func cocoon(t *testing.T, stateDir, dataDir string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(filepath.Join(testEnv.bin, "cocoon"), args...)
	cmd.Env = append(os.Environ(),
		"COCOON_IMAGE_DIR="+testEnv.imageDir,
		"COCOON_STATE_DIR="+stateDir,
		"COCOON_DATA_DIR="+dataDir,
	)
	return cmd
}
