package integration

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// Checkpoint and restore through containerd's own ctr: the whole VM is
// saved into the checkpoint image and brought back, its processes going
// on from where they were.

// counter prints and records a count a few times a second, after writing
// a file of its own: what a checkpoint must carry.
const counter = `echo before > /before; i=0; while :; do echo n=$i; echo $i > /count; i=$((i+1)); sleep 0.3; done`

// waitCount waits until the counter of id reached n.
func waitCount(t *testing.T, c *harness.Containerd, id string, n int) int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := c.Ctr("task", "exec", "--exec-id", fmt.Sprintf("count-%d", time.Now().UnixNano()), id, "cat", "/count")
		if got, aerr := strconv.Atoi(strings.TrimSpace(out)); err == nil && aerr == nil && got >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the counter of %s did not reach %d: %q, %v", id, n, out, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// execOut runs a command in container id and returns its output.
func execOut(t *testing.T, c *harness.Containerd, id string, args ...string) string {
	t.Helper()
	return c.MustCtr(append([]string{"task", "exec", "--exec-id", fmt.Sprintf("x-%d", time.Now().UnixNano()), id}, args...)...)
}

// firstCount waits for the first complete "n=K" line of an attached
// task's output and returns K.
func firstCount(t *testing.T, a *attached) int {
	t.Helper()
	re := regexp.MustCompile(`(?m)^n=(\d+)\n`)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := re.FindStringSubmatch(a.out.String()); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("no count line from the restored task after 60 s: %q", a.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestCheckpointRestore: a counter checkpointed with `ctr container
// checkpoint --task --rw` runs on; after it is removed and the layer
// cache emptied, `ctr container restore --live --rw` brings it back under
// its own id and again under a new one, each counting on from where it
// was with its output at the new task, its file there (and in the
// checkpoint's rw diff), the host's wall clock, and random state of its
// own.
func TestCheckpointRestore(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, stateDir := shimContainerd(t, v)
			root := filepath.Dir(stateDir)
			removeAtEnd(t, c, "ck", "ck2", "ck3")
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "ck", "sh", "-c", counter)
			c.WaitStatus(t, "ck", "RUNNING")
			before := waitCount(t, c, "ck", 3)

			began := time.Now()
			c.MustCtr("container", "checkpoint", "--task", "--rw", "ck", "checkpoint/ck:1")
			t.Logf("containerd %s: ctr container checkpoint took %v", v, time.Since(began).Round(time.Millisecond))
			// Without exit it runs on, and ctr resumed it.
			c.WaitStatus(t, "ck", "RUNNING")
			if after := waitCount(t, c, "ck", before+2); after < before+2 {
				t.Errorf("the checkpointed counter did not run on: %d then %d", before, after)
			}
			killAndRemove(t, c, "ck")

			// The layer cache loses the image's layer: the restore
			// rebuilds it, to the bytes the guest had.
			if out, err := cocoon(t, stateDir, filepath.Join(root, "lib"), "gc", "--layers-min-idle", "-1s").CombinedOutput(); err != nil || !strings.Contains(string(out), "removed 1 images") {
				t.Fatalf("cocoon gc: %v\n%s", err, out)
			}

			c.MustCtr("container", "restore", "--live", "--rw", "ck", "checkpoint/ck:1")
			c.WaitStatus(t, "ck", "RUNNING")
			att := startAttached(t, c, "task", "attach", "ck")
			if got := firstCount(t, att); got < before {
				t.Errorf("the restored counter printed n=%d first; it was at %d before the checkpoint", got, before)
			}
			if strings.Contains(att.out.String(), "n=0\n") {
				t.Errorf("the restored counter started over: %q", att.out.String())
			}
			// Detached again: an attached ctr deletes the task when it
			// exits, which would race the removal below.
			_ = att.cmd.Process.Kill()
			<-att.done
			if got := strings.TrimSpace(execOut(t, c, "ck", "cat", "/before")); got != "before" {
				t.Errorf("file written before the checkpoint: %q", got)
			}
			// --rw: the new container's snapshot was made from the
			// checkpoint image's rw diff, which holds the file.
			upper, _ := snapshotDirs(t, c, "ck")
			if data, err := os.ReadFile(filepath.Join(upper, "before")); err != nil || string(data) != "before\n" {
				t.Errorf("the checkpoint's rw diff lacks /before: %q, %v", data, err)
			}

			// A second restore of the same checkpoint, under a new id.
			c.MustCtr("container", "restore", "--live", "ck2", "checkpoint/ck:1")
			c.WaitStatus(t, "ck2", "RUNNING")
			if got := waitCount(t, c, "ck2", before); got < before {
				t.Errorf("ck2 counts from %d", got)
			}
			r1 := execOut(t, c, "ck", "sh", "-c", "head -c 32 /dev/urandom | od -An -tx1")
			r2 := execOut(t, c, "ck2", "sh", "-c", "head -c 32 /dev/urandom | od -An -tx1")
			if strings.TrimSpace(r1) == "" || r1 == r2 {
				t.Errorf("two restores of one checkpoint read the same random bytes: %q", r1)
			}
			for _, id := range []string{"ck", "ck2"} {
				lo := time.Now().Unix()
				out := execOut(t, c, id, "date", "+%s")
				hi := time.Now().Unix()
				got, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
				if err != nil || got < lo-1 || got > hi+1 {
					t.Errorf("%s: guest clock %q, host %d-%d", id, out, lo, hi)
				}
			}
			c.MustCtr("task", "kill", "-s", "SIGKILL", "ck")
			c.WaitStatus(t, "ck", "STOPPED")
			c.MustCtr("task", "rm", "ck")
			c.MustCtr("container", "rm", "ck")

			// A restored sandbox is checkpointed and restored again,
			// under a third id: the guest still knows the container as
			// ck, and its new processes by the restore's own prefix.
			// containerd 1.6's client cannot restore that checkpoint
			// ("media type not found": it records the restored
			// container's image, itself a checkpoint index, where it
			// later looks for an image manifest), so 2.x only.
			if v == "1.6" {
				killAndRemove(t, c, "ck2")
				leakAudit(t, c, root)
				return
			}
			n2 := waitCount(t, c, "ck2", 0)
			c.MustCtr("container", "checkpoint", "--task", "ck2", "checkpoint/ck2:1")
			killAndRemove(t, c, "ck2")
			c.MustCtr("container", "restore", "--live", "ck3", "checkpoint/ck2:1")
			c.WaitStatus(t, "ck3", "RUNNING")
			if got := waitCount(t, c, "ck3", n2); got < n2 {
				t.Errorf("ck3 counts from %d, ck2 was at %d", got, n2)
			}
			killAndRemove(t, c, "ck3")
			leakAudit(t, c, root)
		})
	}
}

// TestCheckpointExit: `ctr task checkpoint --exit` ends the task once it
// is saved on containerd 2.x, which sends runc's options to every
// runtime; containerd 1.x's ctr sends them only to runc, so there the
// task runs on (docs/checkpoint.md).
func TestCheckpointExit(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "ckx")
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "ckx", "sh", "-c", counter)
			c.WaitStatus(t, "ckx", "RUNNING")
			waitCount(t, c, "ckx", 1)
			out := c.MustCtr("task", "checkpoint", "--exit", "ckx")
			if strings.TrimSpace(out) == "" {
				t.Errorf("ctr task checkpoint printed no image name")
			}
			if v == "1.6" {
				c.WaitStatus(t, "ckx", "RUNNING")
				killAndRemove(t, c, "ckx")
				return
			}
			c.WaitStatus(t, "ckx", "STOPPED")
			c.MustCtr("task", "rm", "ckx")
			c.MustCtr("container", "rm", "ckx")
			c.WaitNoShim(t)
		})
	}
}

// TestCheckpointRefused: a checkpoint whose memory image has a byte
// flipped, that lacks a file, whose manifest was edited or names a file
// outside its directory, or that was made with another guest image, or
// in another namespace, is refused at restore with an error that names
// the reason, and nothing is left running or on disk.
func TestCheckpointRefused(t *testing.T) {
	c, img, stateDir := shimContainerd(t, "2.4")
	root := filepath.Dir(stateDir)
	removeAtEnd(t, c, "src", "bad")
	c.MustCtr("run", "-d", "--runtime", runtimeName, img, "src", "sh", "-c", counter)
	c.WaitStatus(t, "src", "RUNNING")
	waitCount(t, c, "src", 1)
	c.MustCtr("container", "checkpoint", "--task", "src", "checkpoint/src:1")
	killAndRemove(t, c, "src")

	blob, _, err := c.CheckpointBlob("checkpoint/src:1")
	if err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(blob, orig, 0o444) })
	manifest := func(edit func(m map[string]any)) func(map[string][]byte) {
		return func(files map[string][]byte) {
			var m map[string]any
			if err := json.Unmarshal(files["manifest.json"], &m); err != nil {
				t.Fatal(err)
			}
			edit(m)
			files["manifest.json"], _ = json.Marshal(m)
		}
	}
	cases := []struct {
		name   string
		mutate func(files map[string][]byte)
		want   string
	}{
		{"byte flipped in the memory image", func(f map[string][]byte) { f["vm.state"][len(f["vm.state"])/2] ^= 0x40 }, `file "vm.state": sha256`},
		{"file removed", func(f map[string][]byte) { delete(f, "vm.state") }, `"vm.state" is missing`},
		{"manifest edited", manifest(func(m map[string]any) { m["machine"].(map[string]any)["memory_mib"] = 4096 }), "memory_mib"},
		{"another guest image", manifest(func(m map[string]any) {
			m["guest"].(map[string]any)["initrd"] = "sha256:" + strings.Repeat("ab", 32)
		}), "initrd"},
		{"name outside the directory", manifest(func(m map[string]any) { m["state"] = "../vm.state" }), `"../vm.state"`},
		{"another namespace", manifest(func(m map[string]any) { m["namespace"] = "elsewhere" }), "io.cocoon.checkpoint.allow-other-namespace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			files := readTar(t, orig)
			tc.mutate(files)
			if err := os.WriteFile(blob, writeTar(t, files), 0o444); err != nil {
				t.Fatal(err)
			}
			out, err := c.Ctr("container", "restore", "--live", "bad", "checkpoint/src:1")
			if err == nil {
				t.Fatalf("restore of a checkpoint with a %s succeeded: %s", tc.name, out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("restore refused with %v, want an error naming %q", err, tc.want)
			}
			t.Logf("refused: %v", err)
			_, _ = c.Ctr("task", "rm", "-f", "bad")
			_, _ = c.Ctr("container", "rm", "bad")
			c.WaitNoShim(t)
			assertClean(t, stateDir)
		})
	}
	leakAudit(t, c, root)
}

func readTar(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Clean(h.Name)] = b
	}
}

func writeTar(t *testing.T, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, b := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestCheckpointInspect: `ctr task checkpoint --image-path DIR` on
// containerd 2.x leaves the checkpoint directory where the client said
// (containerd stores no image then), and `cocoon checkpoint inspect`
// verifies it without loading it, and names what a flipped byte broke.
func TestCheckpointInspect(t *testing.T) {
	c, img, stateDir := shimContainerd(t, "2.4")
	root := filepath.Dir(stateDir)
	removeAtEnd(t, c, "insp")
	c.MustCtr("run", "-d", "--runtime", runtimeName, img, "insp", "sh", "-c", counter)
	c.WaitStatus(t, "insp", "RUNNING")
	waitCount(t, c, "insp", 1)
	dir := filepath.Join(t.TempDir(), "ck")
	c.MustCtr("task", "checkpoint", "--image-path", dir, "insp")
	c.WaitStatus(t, "insp", "RUNNING")
	killAndRemove(t, c, "insp")
	for _, name := range []string{"manifest.json", "vm.state"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", name, err, fi.Mode())
		}
	}
	out, err := cocoon(t, stateDir, filepath.Join(root, "lib"), "checkpoint", "inspect", dir).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "verified: ok") || !strings.Contains(string(out), "cocoon-test") {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	t.Logf("cocoon checkpoint inspect:\n%s", out)
	state := filepath.Join(dir, "vm.state")
	data, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/3] ^= 1
	if err := os.WriteFile(state, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = cocoon(t, stateDir, filepath.Join(root, "lib"), "checkpoint", "inspect", dir).CombinedOutput()
	if exitCode(err) == 0 || !strings.Contains(string(out), `"vm.state"`) {
		t.Errorf("inspect of a corrupted checkpoint: %v\n%s", err, out)
	}
}
