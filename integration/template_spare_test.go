package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
	"github.com/cocoonrt/cocoon/runtime/sandbox"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// Spares through containerd and ctr: a start from a template leaves a
// spare of its shape (a clone restored, warmed and paused ahead of need),
// and the next start takes its VM over.

// waitSpare waits for the spare of key under stateDir to wait for a
// claim, and returns the pid of its QEMU.
func waitSpare(t *testing.T, stateDir, key string) int {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if sandbox.SpareWaits(stateDir, key) {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(templatesDir(stateDir), template.LogName))
			t.Fatalf("no spare of %s waits after 90 s; the spares' log:\n%s", key, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A spare's VM keeps the name of the directory it was made in after
	// a sandbox took it over; the waiting one is the one still there.
	dir := sandbox.SpareDir(stateDir, key)
	if dir == "" {
		t.Fatalf("the spare of %s is ready, and it has not one state directory", key)
	}
	out, err := exec.Command("pgrep", "-f", "qemu-system.*-name guest="+regexp.QuoteMeta(dir)+"( |$)").Output()
	pid, perr := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || perr != nil {
		t.Fatalf("the qemu of the spare in %s: %q (%v)", dir, out, err)
	}
	return pid
}

// assertSpare fails t unless the shim's log says that sandbox id started
// from template key taking its spare over (spare true) or not.
func assertSpare(t *testing.T, c *harness.Containerd, id, key string, spare bool) logEntry {
	t.Helper()
	assertFromTemplate(t, c, id, key, "required")
	e := sandboxLog(c, msgStarted, id, 0)
	if e == nil {
		return nil
	}
	if want := map[bool]string{true: "true", false: "false"}[spare]; e["spare"] != want {
		t.Errorf("%s started from template %s with spare=%q, want %s", id, key, e["spare"], want)
	}
	return e
}

// TestTemplateSpare: with template.spare on, a start from a template
// leaves a spare of its shape and the next start takes it over, as the
// shim's log says; that container runs and has its own identity (its id
// as hostname, the host's clock, random bytes and a boot id that a
// second spare's container does not share). A spare whose QEMU is
// killed ends itself, and the next start is a clone; of two starts at
// once, one takes the spare over and the other is a clone; `cocoon
// template rm` stops a waiting spare; nothing is left.
func TestTemplateSpare(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			t.Setenv("COCOON_TEMPLATE", "required")
			t.Setenv("COCOON_TEMPLATE_SPARE", "true")
			c, img, stateDir := shimContainerd(t, v)
			ids := []string{"first", "spared1", "spared2", "afterkill", "race1", "race2"}
			removeAtEnd(t, c, ids...)
			key := createTemplate(t, c)
			// Before the state directory is checked: a spare still
			// waiting is stopped.
			t.Cleanup(func() { runCocoon(t, c, "template", "rm", "--all") })

			// No spare yet: the first start is a clone's, and leaves one.
			c.MustCtr("run", "--rm", "--runtime", runtimeName, img, ids[0], "true")
			assertSpare(t, c, ids[0], key, false)

			type guest struct{ random, bootID string }
			seen := map[string]guest{}
			for _, id := range ids[1:3] {
				waitSpare(t, stateDir, key)
				c.MustCtr("run", "-d", "--runtime", runtimeName, img, id, "sleep", "600")
				c.WaitStatus(t, id, "RUNNING")
				e := assertSpare(t, c, id, key, true)
				t.Logf("%s took the spare over: ready in %s ms", id, e["ready_ms"])
				if h := strings.TrimSpace(execOut(t, c, id, "hostname")); h != id {
					t.Errorf("%s: hostname %q, want its id", id, h)
				}
				guestClock(t, c, id)
				seen[id] = guest{
					random: strings.Join(strings.Fields(execOut(t, c, id, "sh", "-c", "head -c 16 /dev/urandom | od -An -tx1")), ""),
					bootID: strings.TrimSpace(execOut(t, c, id, "cat", "/proc/sys/kernel/random/boot_id")),
				}
			}
			a, b := seen[ids[1]], seen[ids[2]]
			if len(a.random) != 32 || a.random == b.random {
				t.Errorf("two containers from spares read random bytes %q and %q", a.random, b.random)
			}
			if a.bootID == "" || a.bootID == b.bootID {
				t.Errorf("two containers from spares have boot ids %q and %q", a.bootID, b.bootID)
			}

			// A spare whose QEMU dies ends itself: the next start finds
			// none and is a clone's.
			pid := waitSpare(t, stateDir, key)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(30 * time.Second); sandbox.SpareHeld(stateDir, key); time.Sleep(100 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the spare process still runs 30 s after its qemu was killed")
				}
			}
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, ids[3], "sleep", "600")
			c.WaitStatus(t, ids[3], "RUNNING")
			assertSpare(t, c, ids[3], key, false)

			// Two starts at once and one spare: one takes it over, the
			// other starts a clone, and both run.
			waitSpare(t, stateDir, key)
			var wg sync.WaitGroup
			for _, id := range ids[4:] {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := c.Ctr("run", "-d", "--runtime", runtimeName, img, id, "sleep", "600"); err != nil {
						t.Errorf("ctr run %s: %v", id, err)
					}
				}()
			}
			wg.Wait()
			spared := 0
			for _, id := range ids[4:] {
				c.WaitStatus(t, id, "RUNNING")
				assertFromTemplate(t, c, id, key, "required")
				if e := sandboxLog(c, msgStarted, id, 0); e != nil && e["spare"] == "true" {
					spared++
				}
			}
			if spared != 1 {
				t.Errorf("%d of two starts at once took the one spare over, want 1", spared)
			}

			// A start left a spare, which `cocoon template rm` stops.
			waitSpare(t, stateDir, key)
			if out := runCocoon(t, c, "template", "rm", key); !strings.Contains(out, "stopped the spare of template "+key) {
				t.Errorf("cocoon template rm: %s", out)
			}
			if sandbox.SpareHeld(stateDir, key) {
				t.Error("a spare still runs after cocoon template rm")
			}
			killAndRemove(t, c, ids[1:]...)
			leakAudit(t, c, filepath.Dir(stateDir))
		})
	}
}

// runCocoon runs the cocoon command with c's shims' environment and
// returns its output; it fails t if the command fails.
func runCocoon(t *testing.T, c *harness.Containerd, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(testEnv.bin, "cocoon"), args...)
	cmd.Env = append(os.Environ(), c.Env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("cocoon %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// startSpare makes the spare of key with `cocoon template spare`, as a
// shim does after a start from the template, and waits for it; the test
// stops it at its end if it still waits.
func startSpare(t *testing.T, c *harness.Containerd, stateDir, key string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(testEnv.bin, "cocoon"), "template", "spare", "--key", key)
	cmd.Env = append(os.Environ(), c.Env...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		stopSpare(t, stateDir, key)
		if err := <-done; err != nil {
			t.Errorf("cocoon template spare: %v\n%s", err, out.String())
		}
	})
	waitSpare(t, stateDir, key)
}

// stopSpare stops the spare of key if one waits or is being made.
func stopSpare(t *testing.T, stateDir, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := sandbox.EndSpare(ctx, stateDir, key); err != nil {
		t.Error(err)
	}
}
