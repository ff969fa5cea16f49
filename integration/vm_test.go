package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/runtime/admin"
	"github.com/cocoonrt/cocoon/runtime/agent"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/image"
)

// TestCheck runs `cocoon check` as a user would and holds it to its
// contract: exit 0 and a last line naming the time, accelerator and channel.
func TestCheck(t *testing.T) {
	state, data := stateRoot(t)
	out, err := cocoon(t, state, data, "check").CombinedOutput()
	t.Logf("cocoon check:\n%s", out)
	if err != nil {
		t.Fatalf("cocoon check: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	if !regexp.MustCompile(`^ready in [0-9]+ ms \((tcg|kvm), (serial|vsock)\)$`).MatchString(last) {
		t.Fatalf("last line %q does not have the form `ready in <N> ms (<accel>, <channel>)`", last)
	}
	// This machine's /dev/kvm is PVM: picking it would hang the guest.
	if hypervisor.LocalAccelHost().CPUFlags != nil && !hasHWVirt() && !strings.Contains(last, "(tcg,") {
		t.Fatalf("no vmx/svm on this host, but check did not pick tcg: %q", last)
	}
}

func hasHWVirt() bool {
	for _, f := range hypervisor.LocalAccelHost().CPUFlags {
		if f == "vmx" || f == "svm" {
			return true
		}
	}
	return false
}

// TestRunOutputAndExitCode runs a command in a VM and checks that stdout,
// stderr and the exit code arrive as the guest produced them.
func TestRunOutputAndExitCode(t *testing.T) {
	state, data := stateRoot(t)
	cmd := cocoon(t, state, data, "run", "--", "/bin/sh", "-c", "uname -r; echo to-stderr >&2; exit 7")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("cocoon run: want exit status 7, got %v (stderr: %s)", err, stderr.String())
	}
	img, err := image.Open(testEnv.imageDir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(stdout.String()); got != img.Manifest.Kernel.Release {
		t.Errorf("guest uname -r = %q, want the image's kernel %q", got, img.Manifest.Kernel.Release)
	}
	if got := stderr.String(); got != "to-stderr\n" {
		t.Errorf("stderr = %q, want %q", got, "to-stderr\n")
	}
}

// TestRunStdinAndLargeOutput pipes stdin through the guest and back and
// checks that 16 MiB of output arrive byte-exact.
func TestRunStdinAndLargeOutput(t *testing.T) {
	state, data := stateRoot(t)
	in := bytes.Repeat([]byte("cocoon stdin line\n"), 1000)
	cmd := cocoon(t, state, data, "run", "--", "/bin/cat")
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cocoon run cat: %v", err)
	}
	if !bytes.Equal(out, in) {
		t.Fatalf("cat through the guest returned %d bytes, want the %d sent", len(out), len(in))
	}

	const size = 16 << 20
	cmd = cocoon(t, state, data, "run", "--", "/bin/sh", "-c", "head -c 16777216 /dev/zero | tr '\\0' 'x'")
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("cocoon run large output: %v", err)
	}
	want := sha256.Sum256(bytes.Repeat([]byte("x"), size))
	if got := sha256.Sum256(out); got != want || len(out) != size {
		t.Fatalf("large output: got %d bytes sha256 %s, want %d bytes sha256 %s",
			len(out), hex.EncodeToString(got[:]), size, hex.EncodeToString(want[:]))
	}
}

// brokenImage copies the guest image to a new directory, lets mutate
// change it, and rewrites the manifest digests to match, so that the
// failure under test is the boot, not digest verification.
func brokenImage(t *testing.T, mutate func(dir string, m *image.Manifest)) string {
	t.Helper()
	src, err := image.Open(testEnv.imageDir)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range []string{src.Manifest.Kernel.Path, src.Manifest.Initrd.Path} {
		if err := exec.Command("cp", filepath.Join(src.Dir, f), filepath.Join(dir, f)).Run(); err != nil {
			t.Fatal(err)
		}
	}
	m := src.Manifest
	mutate(dir, &m)
	for _, f := range []*image.File{&m.Kernel.File, &m.Initrd} {
		b, err := os.ReadFile(filepath.Join(dir, f.Path))
		if err != nil {
			continue // the test removed it on purpose
		}
		sum := sha256.Sum256(b)
		f.SHA256 = hex.EncodeToString(sum[:])
	}
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, image.ManifestName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestBootFailures checks that a guest that cannot boot gives an error
// that names the cause, and that nothing is left behind.
func TestBootFailures(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(dir string, m *image.Manifest)
		// want is a regular expression the error must match.
		want string
	}{{
		name: "kernel path missing",
		mutate: func(dir string, m *image.Manifest) {
			os.Remove(filepath.Join(dir, m.Kernel.Path))
		},
		want: `vmlinux.*no such file`,
	}, {
		// Caught before QEMU starts: QEMU would run random bytes as code.
		name: "kernel is garbage",
		mutate: func(dir string, m *image.Manifest) {
			os.WriteFile(filepath.Join(dir, m.Kernel.Path), bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 4096), 0o644)
		},
		want: `vmlinux is neither an ELF vmlinux nor a bzImage`,
	}, {
		// Shaped like a bzImage, so QEMU itself must refuse it, and its
		// words must reach the user.
		name: "kernel refused by qemu",
		mutate: func(dir string, m *image.Manifest) {
			b := make([]byte, 64<<10)
			copy(b[0x202:], "HdrS")
			b[0x206], b[0x207] = 0x00, 0x01 // boot protocol 1.00: too old for an initrd
			os.WriteFile(filepath.Join(dir, m.Kernel.Path), b, 0o644)
		},
		want: `qemu stderr: .*kernel`,
	}, {
		name: "initrd without an agent",
		mutate: func(dir string, m *image.Manifest) {
			// An empty newc archive: the kernel finds no /init and panics.
			os.WriteFile(filepath.Join(dir, m.Initrd.Path), emptyCPIO(), 0o644)
			m.Initrd.Compression = "none"
		},
		want: `(?s)before the agent was ready.*last guest console lines:.*(init|panic)`,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			state, data := stateRoot(t)
			cmd := cocoon(t, state, data, "run", "--", "/bin/true")
			cmd.Env = append(cmd.Env, "COCOON_IMAGE_DIR="+brokenImage(t, tc.mutate), "COCOON_START_TIMEOUT=60s")
			start := time.Now()
			out, err := cmd.CombinedOutput()
			t.Logf("failed after %v:\n%s", time.Since(start).Round(time.Millisecond), out)
			if err == nil {
				t.Fatal("cocoon run succeeded with a broken guest image")
			}
			if !regexp.MustCompile(tc.want).Match(out) {
				t.Fatalf("error does not match %q", tc.want)
			}
		})
	}
}

// emptyCPIO is a newc archive holding only its trailer.
func emptyCPIO() []byte {
	hdr := "070701" + strings.Repeat("00000000", 11) + "0000000B" + "00000000" + "TRAILER!!!\x00"
	for len(hdr)%4 != 0 {
		hdr += "\x00"
	}
	b := []byte(hdr)
	return append(b, make([]byte, 512-len(b)%512)...)
}

// TestVMKilledIsNoticed kills QEMU under a running process and checks that
// the host notices at once and still cleans up.
func TestVMKilledIsNoticed(t *testing.T) {
	state, data := stateRoot(t)
	t.Setenv("COCOON_IMAGE_DIR", testEnv.imageDir)
	t.Setenv("COCOON_STATE_DIR", state)
	t.Setenv("COCOON_DATA_DIR", data)
	env, err := admin.LoadEnv("")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := env.StartSandbox(ctx, "killed")
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Stop(ctx)
	var out bytes.Buffer
	p, err := sb.Agent().Start(ctx, agent.ProcessSpec{ID: "sleeper", Args: []string{"/bin/sleep", "1000"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(sb.VM().PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case <-sb.VM().Exited():
		t.Logf("vm exit noticed after %v", time.Since(killed))
	case <-time.After(5 * time.Second):
		t.Fatal("vm exit not noticed within 5s of SIGKILL")
	}
	if sb.VM().ExitError() == nil {
		t.Error("a SIGKILLed vm reports a clean exit")
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := p.Wait(wctx); err == nil {
		t.Fatal("waiting on a process of a killed vm succeeded")
	} else if wctx.Err() != nil {
		t.Fatalf("waiting on a process of a killed vm hung until the deadline: %v", err)
	}
	if err := sb.Stop(ctx); err != nil {
		t.Fatalf("stop after kill: %v", err)
	}
	if _, err := os.Stat(sb.Dir); !os.IsNotExist(err) {
		t.Fatalf("state dir %s still there after stop: %v", sb.Dir, err)
	}
}
