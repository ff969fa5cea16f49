package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
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
	"github.com/cocoonrt/cocoon/runtime/template"
)

// Templates through containerd and ctr: sandboxes that start from a
// saved, booted guest of their shape instead of booting, what a clone
// must not share with its template or its siblings (random state, clock,
// hostname, boot id), the Task API on a clone, and, in
// template_stale_test.go, templates that are stale or corrupt, the
// required mode without a template, and the one background creation of
// auto mode.

// Shim log messages the tests look for.
const (
	msgStarted = "sandbox started from template"
	msgBooted  = "sandbox booted"
	msgNoTpl   = "booting the sandbox: no template to start it from"
	msgMaking  = "making the template of this shape in the background"
)

// templatesDir is the store of templates of the shims of shimContainerd
// whose state directory is stateDir.
func templatesDir(stateDir string) string {
	return filepath.Join(dataDirOf(stateDir), template.DirName)
}

// dataDirOf is the data directory shimContainerd gives the shims whose
// state directory is stateDir.
func dataDirOf(stateDir string) string { return filepath.Join(filepath.Dir(stateDir), "lib") }

// createTemplate runs `cocoon template create` with args and the
// environment c's shims have, and returns the key of the template it
// made.
func createTemplate(t *testing.T, c *harness.Containerd, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(testEnv.bin, "cocoon"), append([]string{"template", "create"}, args...)...)
	cmd.Env = append(os.Environ(), c.Env...)
	began := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cocoon template create: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^template ([0-9a-f]{32}) created in `).FindSubmatch(out)
	if m == nil {
		t.Fatalf("cocoon template create made no template:\n%s", out)
	}
	t.Logf("cocoon template create took %v: %s", time.Since(began).Round(time.Millisecond), strings.TrimSpace(string(out)))
	return string(m[1])
}

// readManifest reads the manifest of the template key.
func readManifest(t *testing.T, stateDir, key string) *template.Manifest {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(templatesDir(stateDir), key, template.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	var m template.Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s of %s: %v", template.ManifestName, key, err)
	}
	return &m
}

// checkTemplateFiles fails t unless the files of the template key have
// the sizes and digests its manifest lists, hashed here.
func checkTemplateFiles(t *testing.T, stateDir, key string) {
	t.Helper()
	m := readManifest(t, stateDir, key)
	if len(m.Files) != 2 {
		t.Errorf("template %s lists files %v", key, m.Files)
	}
	for _, f := range m.Files {
		p := filepath.Join(templatesDir(stateDir), key, f.Name)
		fd, err := os.Open(p)
		if err != nil {
			t.Error(err)
			continue
		}
		h := sha256.New()
		n, err := io.Copy(h, fd)
		fd.Close()
		if err != nil {
			t.Error(err)
			continue
		}
		if got := hex.EncodeToString(h.Sum(nil)); n != f.Size || got != f.SHA256 {
			t.Errorf("template %s: %s is %d bytes, sha256 %s; its manifest says %d bytes, %s", key, f.Name, n, got, f.Size, f.SHA256)
		}
	}
}

// logEntry is one line of the shim's log (in containerd's), its fields
// by name: msg, level, sandbox, key...
type logEntry map[string]string

// logField is one key=value of a logrus text line; a value with spaces
// or quotes is quoted as Go quotes strings.
var logField = regexp.MustCompile(`([A-Za-z_][\w.]*)=("(?:[^"\\]|\\.)*"|\S*)`)

// shimLog lists the entries of containerd's log whose message is msg.
func shimLog(c *harness.Containerd, msg string) []logEntry {
	var out []logEntry
	for _, line := range strings.Split(c.Log(), "\n") {
		if !strings.Contains(line, `msg="`+msg+`"`) {
			continue
		}
		e := logEntry{}
		for _, m := range logField.FindAllStringSubmatch(line, -1) {
			v := m[2]
			if strings.HasPrefix(v, `"`) {
				if u, err := strconv.Unquote(v); err == nil {
					v = u
				}
			}
			e[m[1]] = v
		}
		if e["msg"] == msg {
			out = append(out, e)
		}
	}
	return out
}

// sandboxLog returns sandbox id's entry of message msg in the shim's log,
// waiting wait at most for it; nil if there is none.
func sandboxLog(c *harness.Containerd, msg, id string, wait time.Duration) logEntry {
	return waitShimLog(c, msg, "sandbox", id, wait)
}

// waitShimLog returns the first entry of message msg in the shim's log
// whose field is value, waiting wait at most for it; nil if there is
// none.
func waitShimLog(c *harness.Containerd, msg, field, value string, wait time.Duration) logEntry {
	deadline := time.Now().Add(wait)
	for {
		for _, e := range shimLog(c, msg) {
			if e[field] == value {
				return e
			}
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// assertFromTemplate fails t unless the shim's log says that sandbox id
// started from template key in mode, and never that it booted.
func assertFromTemplate(t *testing.T, c *harness.Containerd, id, key, mode string) {
	t.Helper()
	// The shim logs the line before it answers the task's create;
	// containerd copies it to its log a moment later.
	e := sandboxLog(c, msgStarted, id, 10*time.Second)
	if e == nil {
		t.Errorf("the shim's log does not say that %s started from a template; its lines of %s:\n%s", id, id, sandboxLines(c, id))
		return
	}
	if e["key"] != key || e["template_mode"] != mode || e["ready_ms"] == "" {
		t.Errorf("%s started from template %q in mode %q (ready_ms %q), want %s in mode %s", id, e["key"], e["template_mode"], e["ready_ms"], key, mode)
	}
	// One or the other is logged, at the same time.
	if b := sandboxLog(c, msgBooted, id, 0); b != nil {
		t.Errorf("the shim's log also says that %s booted: %v", id, b)
	}
	t.Logf("%s started from template %s, ready in %s ms", id, e["key"], e["ready_ms"])
}

// sandboxLines are the lines of containerd's log that name sandbox id.
func sandboxLines(c *harness.Containerd, id string) string {
	var out []string
	for _, line := range strings.Split(c.Log(), "\n") {
		if strings.Contains(line, "sandbox="+id+" ") || strings.HasSuffix(line, "sandbox="+id) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// guestClock fails t unless the clock of container id is the host's,
// to the second.
func guestClock(t *testing.T, c *harness.Containerd, id string) {
	t.Helper()
	lo := time.Now().Unix()
	out := execOut(t, c, id, "date", "+%s")
	hi := time.Now().Unix()
	got, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil || got < lo-1 || got > hi+1 {
		t.Errorf("%s: guest clock %q, host %d-%d", id, out, lo, hi)
	}
}

// TestTemplateRun: with template.mode required, a template made with
// `cocoon template create` serves `ctr run`: the shim's log says so, the
// command's output and exit status come back, and two clones running at
// once read different random bytes, have the host's clock (the template
// was saved seconds before), their own ids as hostnames and boot ids of
// their own, and leave the template's files as they were.
func TestTemplateRun(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			t.Setenv("COCOON_TEMPLATE", "required")
			c, img, stateDir := shimContainerd(t, v)
			ids := []string{"tplrun", "clone1", "clone2"}
			removeAtEnd(t, c, ids...)
			key := createTemplate(t, c)
			saved := readManifest(t, stateDir, key).Created
			for _, name := range []string{template.ManifestName, template.StateName, template.MemoryName, "verified.json"} {
				if _, err := os.Stat(filepath.Join(templatesDir(stateDir), key, name)); err != nil {
					t.Errorf("template %s: %v", key, err)
				}
			}
			// A clone whose clock were the template's would be this far
			// behind the host's.
			time.Sleep(time.Until(saved.Add(6 * time.Second)))

			var stdout, stderr bytes.Buffer
			cmd := c.CtrCommand(context.Background(), "run", "--rm", "--runtime", runtimeName, img, ids[0],
				"sh", "-c", "echo from-template; echo to-stderr >&2; exit 7")
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			began := time.Now()
			if err := cmd.Run(); exitCode(err) != 7 {
				t.Fatalf("ctr run: want exit status 7, got %v\n%s%s", err, stdout.String(), stderr.String())
			}
			t.Logf("containerd %s: ctr run --rm from the template took %v", v, time.Since(began).Round(time.Millisecond))
			if stdout.String() != "from-template\n" || !strings.Contains(stderr.String(), "to-stderr\n") {
				t.Errorf("stdout %q, stderr %q", stdout.String(), stderr.String())
			}
			assertFromTemplate(t, c, ids[0], key, "required")
			c.WaitNoShim(t)

			// Two clones at once.
			type guest struct{ random, bootID string }
			seen := map[string]guest{}
			for _, id := range ids[1:] {
				c.MustCtr("run", "-d", "--runtime", runtimeName, img, id, "sleep", "600")
			}
			for _, id := range ids[1:] {
				c.WaitStatus(t, id, "RUNNING")
				assertFromTemplate(t, c, id, key, "required")
				g := guest{
					random: strings.Join(strings.Fields(execOut(t, c, id, "sh", "-c", "head -c 16 /dev/urandom | od -An -tx1")), ""),
					bootID: strings.TrimSpace(execOut(t, c, id, "cat", "/proc/sys/kernel/random/boot_id")),
				}
				if len(g.random) != 32 {
					t.Errorf("%s: 16 random bytes read as %q", id, g.random)
				}
				if !regexp.MustCompile(`^[0-9a-f-]{36}$`).MatchString(g.bootID) {
					t.Errorf("%s: boot id %q", id, g.bootID)
				}
				guestClock(t, c, id)
				if h := strings.TrimSpace(execOut(t, c, id, "hostname")); h != id {
					t.Errorf("%s: hostname %q, want its id", id, h)
				}
				seen[id] = g
			}
			a, b := seen[ids[1]], seen[ids[2]]
			if a.random == b.random {
				t.Errorf("two clones read the same random bytes: %s", a.random)
			}
			if a.bootID == b.bootID {
				t.Errorf("two clones have the same boot id: %s", a.bootID)
			}
			killAndRemove(t, c, ids[1:]...)
			// The clones mapped the template's memory privately.
			checkTemplateFiles(t, stateDir, key)
			if n := len(shimLog(c, msgBooted)); n != 0 {
				t.Errorf("%d sandboxes booted in required mode", n)
			}
			leakAudit(t, c, filepath.Dir(stateDir))
		})
	}
}

// TestTemplateWorksWithFeatures: a container whose sandbox started from a
// template does what any container does: exec with stdin, stdout and
// stderr apart, exec on a terminal, pause and resume, metrics, an OOM
// kill, and a checkpoint after which it runs on, and from which it is
// restored and runs on. It does so in a clone launched for it, and in
// one that took a spare over (whose OOM container takes the next spare).
// The shim is the same on every containerd, so 2.4 is enough.
func TestTemplateWorksWithFeatures(t *testing.T) {
	for _, spare := range []bool{false, true} {
		t.Run(map[bool]string{false: "clone", true: "spare"}[spare], func(t *testing.T) {
			t.Setenv("COCOON_TEMPLATE", "required")
			t.Setenv("COCOON_TEMPLATE_SPARE", strconv.FormatBool(spare))
			templateFeatures(t, spare)
		})
	}
}

func templateFeatures(t *testing.T, spare bool) {
	c, img, stateDir := shimContainerd(t, "2.4")
	removeAtEnd(t, c, "feat", "tploom")
	key := createTemplate(t, c)
	if spare {
		startSpare(t, c, stateDir, key)
	}
	events := c.WatchEvents(t)
	c.MustCtr("run", "-d", "--runtime", runtimeName, img, "feat", "sh", "-c", counter)
	c.WaitStatus(t, "feat", "RUNNING")
	assertSpare(t, c, "feat", key, spare)
	before := waitCount(t, c, "feat", 2)

	// Exec, with stdin, and stdout and stderr apart.
	if out := execOut(t, c, "feat", "echo", "from-exec"); out != "from-exec\n" {
		t.Errorf("exec output %q", out)
	}
	var out, errOut bytes.Buffer
	cat := c.CtrCommand(context.Background(), "task", "exec", "--exec-id", "cat", "feat", "sh", "-c", "cat; echo to-stderr >&2")
	cat.Stdin, cat.Stdout, cat.Stderr = strings.NewReader("through stdin\n"), &out, &errOut
	if err := cat.Run(); err != nil || out.String() != "through stdin\n" || !strings.Contains(errOut.String(), "to-stderr\n") {
		t.Errorf("exec with stdin: stdout %q, stderr %q, %v", out.String(), errOut.String(), err)
	}

	// Exec on a terminal. ctr sizes the terminal only once the process
	// started: the script waits for that, up to 10 s, for a size of two
	// positive numbers (before it, stty may print "0 0" or nothing).
	got, status := ttyExec(t, c, "feat", `tty; i=0; while [ $i -lt 100 ]; do s=$(stty size 2>/dev/null); `+
		`case "$s" in [1-9]*" "[1-9]*) break;; esac; i=$((i+1)); sleep 0.1; done; echo "size:$s"; `+
		`echo ready; read line; echo "got:$line"; exit 5`, "typed-in")
	if status != 5 {
		t.Errorf("ctr task exec -t: exit status %d, want 5", status)
	}
	for _, want := range []string{"\nsize:29 101\n", "\ngot:typed-in\n"} {
		if !strings.Contains("\n"+got, want) {
			t.Errorf("exec on a terminal: output %q lacks %q", got, strings.TrimSpace(want))
		}
	}
	if !regexp.MustCompile(`(?m)^/dev/pts/\d+$`).MatchString(got) {
		t.Errorf("exec on a terminal: output %q names no terminal", got)
	}

	// Pause and resume: the counter stands still, then counts on.
	c.MustCtr("task", "pause", "feat")
	c.WaitStatus(t, "feat", "PAUSED")
	time.Sleep(time.Second)
	c.MustCtr("task", "resume", "feat")
	c.WaitStatus(t, "feat", "RUNNING")
	paused := waitCount(t, c, "feat", 0)
	if n := waitCount(t, c, "feat", paused+2); n < paused+2 {
		t.Errorf("the counter did not count on after resume: %d then %d", paused, n)
	}

	// Metrics, from the guest's cgroup.
	table := c.MustCtr("task", "metrics", "feat")
	if n := metric(t, table, "pids.current"); n < 1 {
		t.Errorf("pids.current = %d", n)
	}
	if n := metric(t, table, "memory.usage"); n == 0 {
		t.Errorf("memory.usage = 0")
	}

	// An OOM kill in a clone of its own.
	oom := c.CtrCommand(context.Background(), "run", "--rm", "--runtime", runtimeName, "--memory-limit", "16777216", img, "tploom",
		"dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1")
	var oomOut bytes.Buffer
	oom.Stdout, oom.Stderr = &oomOut, &oomOut
	if err := oom.Run(); exitCode(err) != 137 {
		t.Errorf("ctr run over its memory limit: want exit status 137, got %v\n%s", err, oomOut.String())
	}
	if !events.WaitFor("/tasks/oom", `"container_id":"tploom"`, 10*time.Second) {
		t.Errorf("no /tasks/oom event for the clone; events: %v", events.Seen("/"))
	}
	assertSpare(t, c, "tploom", key, spare)

	// Checkpoint: the clone runs on.
	before = waitCount(t, c, "feat", before)
	c.MustCtr("container", "checkpoint", "--task", "feat", "checkpoint/feat:1")
	c.WaitStatus(t, "feat", "RUNNING")
	if after := waitCount(t, c, "feat", before+2); after < before+2 {
		t.Errorf("the checkpointed clone did not run on: %d then %d", before, after)
	}
	killAndRemove(t, c, "feat")

	// Restore: it counts on from where it was, with the host's clock.
	c.MustCtr("container", "restore", "--live", "feat", "checkpoint/feat:1")
	c.WaitStatus(t, "feat", "RUNNING")
	if got := waitCount(t, c, "feat", before); got < before {
		t.Errorf("the restored clone counts from %d; it was at %d", got, before)
	}
	att := startAttached(t, c, "task", "attach", "feat")
	if got := firstCount(t, att); got < before {
		t.Errorf("the restored counter printed n=%d first; it was at %d before the checkpoint", got, before)
	}
	_ = att.cmd.Process.Kill()
	<-att.done
	if got := strings.TrimSpace(execOut(t, c, "feat", "cat", "/before")); got != "before" {
		t.Errorf("file written before the checkpoint: %q", got)
	}
	guestClock(t, c, "feat")
	killAndRemove(t, c, "feat")
	checkTemplateFiles(t, stateDir, key)
	if spare {
		stopSpare(t, stateDir, key)
	}
	leakAudit(t, c, filepath.Dir(stateDir))
}

// ttyExec runs script with `ctr task exec -t` in container id, on a
// pseudo-terminal of 29 rows and 101 columns: once the script printed
// "ready" it is sent input and a return. It returns the output, \r
// removed, and ctr's exit status.
func ttyExec(t *testing.T, c *harness.Containerd, id, script, input string) (string, int) {
	t.Helper()
	master, slave, err := harness.OpenPty(29, 101)
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := c.CtrCommand(ctx, "task", "exec", "-t", "--exec-id", "tty", id, "sh", "-c", script)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	var mu sync.Mutex
	var out bytes.Buffer
	text := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.ReplaceAll(out.String(), "\r", "")
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains("\n"+text(), "\nready\n") {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("no prompt on the terminal after 60 s; output so far: %q", text())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := master.Write([]byte(input + "\r")); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	select {
	case <-readDone:
	case <-time.After(5 * time.Second):
	}
	t.Logf("terminal output: %q", text())
	return text(), exitCode(err)
}
