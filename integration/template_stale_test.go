package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
	"github.com/cocoonrt/cocoon/runtime/image"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// creators lists the pids of the `cocoon template create` processes
// whose data directory is dataDir: the background creations that the
// shims of one test started.
func creators(dataDir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if filepath.Base(args[0]) != "cocoon" || !strings.Contains(" "+strings.Join(args, " ")+" ", " template create ") {
			continue
		}
		environ, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		// The last setting of a name is the one the process has.
		var data string
		for _, kv := range strings.Split(string(environ), "\x00") {
			if v, ok := strings.CutPrefix(kv, "COCOON_DATA_DIR="); ok {
				data = v
			}
		}
		if data == dataDir {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitNoCreators waits (timeout at most) until no background creation of
// the test's shims runs, and fails t if one still does: each boots a VM
// under the test's state directory.
func waitNoCreators(t *testing.T, stateDir string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for len(creators(dataDirOf(stateDir))) > 0 {
		if time.Now().After(deadline) {
			t.Errorf("background template creations %v still running after %v", creators(dataDirOf(stateDir)), timeout)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitTemplate waits (90 s at most) for the template key, saved after
// after, to be in place and for no background creation to run, and
// returns its manifest.
func waitTemplate(t *testing.T, stateDir, key string, after time.Time) *template.Manifest {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	manifest := filepath.Join(templatesDir(stateDir), key, template.ManifestName)
	for {
		if _, err := os.Stat(manifest); err == nil && len(creators(dataDirOf(stateDir))) == 0 {
			if m := readManifest(t, stateDir, key); m.Created.After(after) {
				return m
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(templatesDir(stateDir), template.LogName))
			t.Fatalf("no template %s saved after %v within 90 s (creations running: %v); %s:\n%s",
				key, after.Format(time.RFC3339Nano), creators(dataDirOf(stateDir)), template.LogName, log)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// keyDirs lists the entries of the store of templates that are
// template directories (named by a key).
func keyDirs(t *testing.T, stateDir string) []string {
	t.Helper()
	ents, err := os.ReadDir(templatesDir(stateDir))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range ents {
		if e.IsDir() && template.ValidKey(e.Name()) == nil {
			keys = append(keys, e.Name())
		}
	}
	return keys
}

// otherGuestImage is a second, valid guest image: this one's, its initrd
// padded with zeros (which the kernel skips between cpio archives), its
// manifest's digests those of its files.
func otherGuestImage(t *testing.T) string {
	t.Helper()
	return brokenImage(t, func(dir string, m *image.Manifest) {
		f, err := os.OpenFile(filepath.Join(dir, m.Initrd.Path), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
	})
}

// fileDigest is the digest m lists for its file name.
func fileDigest(t *testing.T, m *template.Manifest, name string) string {
	t.Helper()
	for _, f := range m.Files {
		if f.Name == name {
			return f.SHA256
		}
	}
	t.Fatalf("template %s lists no %s", m.Key, name)
	return ""
}

// TestTemplateStale: a template is never loaded unless it is the one of
// the sandbox's shape and holds together. Under another guest image the
// template of the first is passed over: with template.mode required the
// start fails, saying that there is no template of the shape and how to
// make one, and leaves nothing; in auto mode the sandbox boots, the log
// says why, and the background creation makes the new image's template
// next to the old one's. A template whose memory was overwritten is
// passed over with the digest that gave it away, the sandbox boots, and
// the background creation replaces it with one that serves. On
// containerd 1.6 and 2.4.
func TestTemplateStale(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			t.Setenv("COCOON_TEMPLATE", "auto")
			templateStale(t, v)
		})
	}
}

func templateStale(t *testing.T, version string) {
	c, img, stateDir := shimContainerd(t, version)
	// Registered after containerd's stop, so run before it.
	t.Cleanup(func() { waitNoCreators(t, stateDir, 2*time.Minute) })
	removeAtEnd(t, c, "req", "other", "fromb", "corrupt", "fixed")
	keyA := createTemplate(t, c)
	mA := readManifest(t, stateDir, keyA)

	// Another guest image: containerd and its shims use it from now on.
	c.Env = append(c.Env, "COCOON_IMAGE_DIR="+otherGuestImage(t))
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}

	// Required, and no template of the shape: refused, nothing left.
	keyB := assertRefused(t, c, stateDir, "run", "--rm", "--runtime", runtimeName, "--annotation", "io.cocoon.template=required", img, "req", "true")
	if keyB == keyA {
		t.Fatalf("the shape under another guest image has the key %s of the first image's", keyA)
	}

	// Auto: the sandbox boots, and says why.
	if out, err := c.Ctr("run", "--rm", "--runtime", runtimeName, img, "other", "echo", "booted"); err != nil || out != "booted\n" {
		t.Fatalf("ctr run under another guest image: %q, %v", out, err)
	}
	e := sandboxLog(c, msgNoTpl, "other", 10*time.Second)
	if e == nil || e["key"] != keyB || !strings.Contains(e["reason"], "no template of this shape (key "+keyB+")") {
		t.Errorf("the shim's log says of the boot under another guest image %v; want key %s and the reason that it has no template", e, keyB)
	}
	if b := sandboxLog(c, msgBooted, "other", 10*time.Second); b == nil || b["template_mode"] != "auto" || b["key"] != keyB {
		t.Errorf("the shim's log says of the sandbox booted in auto mode %v", b)
	}
	if s := sandboxLog(c, msgStarted, "other", 0); s != nil {
		t.Errorf("the sandbox under another guest image started from a template: %v", s)
	}
	mB := waitTemplate(t, stateDir, keyB, time.Time{})
	// The two templates differ in the guest image, only.
	if mA.Shape.Guest.Initrd == mB.Shape.Guest.Initrd || mA.Shape.Guest.Kernel != mB.Shape.Guest.Kernel {
		t.Errorf("guest images of the two templates: %+v and %+v; want their initrds, only, to differ", mA.Shape.Guest, mB.Shape.Guest)
	}
	sameOtherwise := mB.Shape
	sameOtherwise.Guest = mA.Shape.Guest
	if !sameOtherwise.Equal(mA.Shape) {
		t.Errorf("shapes %+v and %+v differ in more than the guest image", mA.Shape, mB.Shape)
	}
	checkTemplateFiles(t, stateDir, keyA)
	if keys := keyDirs(t, stateDir); len(keys) != 2 {
		t.Errorf("templates %v, want %s and %s", keys, keyA, keyB)
	}
	// It serves the new image's sandboxes.
	if out, err := c.Ctr("run", "--rm", "--runtime", runtimeName, "--annotation", "io.cocoon.template=required", img, "fromb", "echo", "cloned"); err != nil || out != "cloned\n" {
		t.Fatalf("ctr run from the new image's template: %q, %v", out, err)
	}
	assertFromTemplate(t, c, "fromb", keyB, "required")

	// A template whose memory was overwritten is passed over.
	mem, err := os.OpenFile(filepath.Join(templatesDir(stateDir), keyB, template.MemoryName), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = mem.WriteAt(bytes.Repeat([]byte{0x5a}, 4096), int64(mB.Shape.MemoryMiB)<<19)
	if cerr := mem.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	corrupted := time.Now()
	if out, err := c.Ctr("run", "--rm", "--runtime", runtimeName, img, "corrupt", "echo", "booted-anyway"); err != nil || out != "booted-anyway\n" {
		t.Fatalf("ctr run with a corrupt template: %q, %v", out, err)
	}
	e = sandboxLog(c, msgNoTpl, "corrupt", 10*time.Second)
	if e == nil || !strings.Contains(e["reason"], template.ErrStale.Error()) ||
		!regexp.MustCompile(`memory: sha256 is [0-9a-f]{64}, the manifest says `+fileDigest(t, mB, template.MemoryName)).MatchString(e["reason"]) {
		t.Errorf("the shim's log says of the boot past a corrupt template %v; want the memory file's digest named", e)
	} else {
		t.Logf("passed over: %s", e["reason"])
	}
	if b := sandboxLog(c, msgBooted, "corrupt", 10*time.Second); b == nil || !strings.Contains(b["reason"], template.ErrStale.Error()) {
		t.Errorf("the shim's log says of the sandbox booted past a corrupt template %v", b)
	}
	if s := sandboxLog(c, msgStarted, "corrupt", 0); s != nil {
		t.Errorf("the sandbox started from a corrupt template: %v", s)
	}
	// The background creation replaces it.
	waitTemplate(t, stateDir, keyB, corrupted)
	checkTemplateFiles(t, stateDir, keyB)
	if out, err := c.Ctr("run", "--rm", "--runtime", runtimeName, "--annotation", "io.cocoon.template=required", img, "fixed", "echo", "cloned"); err != nil || out != "cloned\n" {
		t.Fatalf("ctr run from the replaced template: %q, %v", out, err)
	}
	assertFromTemplate(t, c, "fixed", keyB, "required")
	if keys := keyDirs(t, stateDir); len(keys) != 2 {
		t.Errorf("templates %v, want %s and %s", keys, keyA, keyB)
	}
	leakAudit(t, c, filepath.Dir(stateDir))
}

// TestTemplateRequiredMissing: with template.mode required and no
// template at all, `ctr run` fails with an error that names the mode, the
// shape's key and `cocoon template create`, starts no creation and leaves
// no container, shim, VM or state. Once `cocoon template create` made the
// template of that key, the same run starts from it.
func TestTemplateRequiredMissing(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			t.Setenv("COCOON_TEMPLATE", "required")
			c, img, stateDir := shimContainerd(t, v)
			removeAtEnd(t, c, "req")
			key := assertRefused(t, c, stateDir, "run", "--rm", "--runtime", runtimeName, img, "req", "echo", "from-template")
			if keys := keyDirs(t, stateDir); len(keys) != 0 {
				t.Errorf("templates %v after a refused start", keys)
			}
			if made := createTemplate(t, c); made != key {
				t.Fatalf("cocoon template create made template %s; the refused start named %s", made, key)
			}
			if out, err := c.Ctr("run", "--rm", "--runtime", runtimeName, img, "req", "echo", "from-template"); err != nil || out != "from-template\n" {
				t.Fatalf("ctr run once the template was made: %q, %v", out, err)
			}
			assertFromTemplate(t, c, "req", key, "required")
			leakAudit(t, c, filepath.Dir(stateDir))
		})
	}
}

// requiredRefusal is the error of a start in required mode without a
// template of the sandbox's shape; it names the shape's key.
var requiredRefusal = regexp.MustCompile(`template\.mode is required, and no template of this shape \(key ([0-9a-f]{32})\) yet; ` +
	"`cocoon template create` makes it")

// TestTemplateAutoOnce: in auto mode four containers started at once,
// with no template of their shape, all boot and run; the background
// creations their shims start make one template, the others giving way
// (or finding it made); a fifth container starts from it, and starts no
// creation. On containerd 1.6 and 2.4.
func TestTemplateAutoOnce(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			t.Setenv("COCOON_TEMPLATE", "auto")
			templateAutoOnce(t, v)
		})
	}
}

func templateAutoOnce(t *testing.T, version string) {
	c, img, stateDir := shimContainerd(t, version)
	t.Cleanup(func() { waitNoCreators(t, stateDir, 2*time.Minute) })
	ids := []string{"auto1", "auto2", "auto3", "auto4"}
	removeAtEnd(t, c, append(ids, "auto5")...)
	errs := make(chan error, len(ids))
	var wg sync.WaitGroup
	began := time.Now()
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Ctr("run", "-d", "--runtime", runtimeName, img, id, "sleep", "600")
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("four containers started at once in %v", time.Since(began).Round(time.Millisecond))
	var key string
	booted := 0
	for _, id := range ids {
		c.WaitStatus(t, id, "RUNNING")
		// A start that came after the template was made uses it.
		var e logEntry
		for deadline := time.Now().Add(10 * time.Second); e == nil && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if e = sandboxLog(c, msgBooted, id, 0); e != nil {
				booted++
			} else {
				e = sandboxLog(c, msgStarted, id, 0)
			}
		}
		if e == nil {
			t.Fatalf("the shim's log says neither that %s booted nor that it started from a template:\n%s", id, sandboxLines(c, id))
		}
		if key == "" {
			key = e["key"]
		}
		if e["key"] != key || e["template_mode"] != "auto" {
			t.Errorf("%s: key %q in mode %q, want %s in auto", id, e["key"], e["template_mode"], key)
		}
	}
	if booted == 0 {
		t.Fatalf("none of four containers started at once without a template booted")
	}
	m := waitTemplate(t, stateDir, key, time.Time{})
	t.Logf("template %s in place %v after the starts (guest ready in %d ms, saved in %d ms)",
		key, time.Since(began).Round(time.Millisecond), m.BootMillis, m.SaveMillis)
	spawned := len(shimLog(c, msgMaking))
	if spawned < 1 || spawned > booted {
		t.Errorf("%d background creations for %d boots", spawned, booted)
	}
	ents, err := os.ReadDir(templatesDir(stateDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		switch name := e.Name(); {
		case name == key, name == template.LogName, name == ".create.lock":
		default:
			t.Errorf("%s in the store of templates, which should hold template %s only", name, key)
		}
	}
	logData, err := os.ReadFile(filepath.Join(templatesDir(stateDir), template.LogName))
	if err != nil {
		t.Fatal(err)
	}
	log := string(logData)
	t.Logf("%s:\n%s", template.LogName, log)
	created := strings.Count(log, "template "+key+" created in ")
	gaveWay := strings.Count(log, template.ErrBusy.Error())
	found := strings.Count(log, "template "+key+" exists")
	if created != 1 || created+gaveWay+found != spawned {
		t.Errorf("%s: %d creations, %d that gave way, %d that found the template; want one creation of the %d started, the others giving way or finding it",
			template.LogName, created, gaveWay, found, spawned)
	}

	out, err := c.Ctr("run", "--rm", "--runtime", runtimeName, img, "auto5", "echo", "from-template")
	if err != nil || out != "from-template\n" {
		t.Fatalf("the fifth container: %q, %v", out, err)
	}
	assertFromTemplate(t, c, "auto5", key, "auto")
	if n := len(shimLog(c, msgMaking)); n != spawned {
		t.Errorf("a start from the template began a background creation")
	}
	killAndRemove(t, c, ids...)
	waitNoCreators(t, stateDir, time.Minute)
	leakAudit(t, c, filepath.Dir(stateDir))
}

// assertRefused runs ctr with args, a run in required mode with no
// template of its shape, and checks that it failed naming the mode, the
// shape's key and `cocoon template create`, left no container, shim, VM
// or state, and began no creation. It returns the key named.
func assertRefused(t *testing.T, c *harness.Containerd, stateDir string, args ...string) string {
	t.Helper()
	out, err := c.Ctr(args...)
	if err == nil {
		t.Fatalf("ctr run in required mode without a template of its shape succeeded: %q", out)
	}
	t.Logf("refused: %v", err)
	m := requiredRefusal.FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("ctr run in required mode without a template: %v; want an error naming the mode, the shape's key and `cocoon template create`", err)
	}
	if ls := c.MustCtr("container", "ls", "-q"); strings.TrimSpace(ls) != "" {
		t.Errorf("containers left after the refused start: %q", ls)
	}
	c.WaitNoShim(t)
	assertClean(t, stateDir)
	if n := len(shimLog(c, msgMaking)); n != 0 {
		t.Errorf("a start refused in required mode began %d background creations", n)
	}
	return m[1]
}
