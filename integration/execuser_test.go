package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// The exec user through containerd and ctr, on a Debian image whose
// /etc/passwd is Debian's own (no uid 4242, nor 1000, nor a user "dev"):
// the user is provisioned in the guest before the init runs, execs as its
// uid get its name and home, sudo works only when asked for, the files
// keep one entry each through execs and a restart, an unknown uid runs as
// runc runs it, and a required user that cannot be made fails the create
// and leaves nothing.

const (
	execUser          = "dev:4242:4242"
	annExecUser       = "io.cocoon.exec-user"
	annExecUserSudo   = "io.cocoon.exec-user.sudo"
	annExecUserNeeded = "io.cocoon.exec-user.required"
)

// execAs runs argv in container id as user (a uid; "" for the spec's)
// and returns its output (stdout, then stderr: ctr's own warnings are on
// its stderr too) and exit status.
func execAs(t *testing.T, c *harness.Containerd, id, user string, argv ...string) (string, int) {
	t.Helper()
	args := []string{"task", "exec", "--exec-id", fmt.Sprintf("x%d", time.Now().UnixNano())}
	if user != "" {
		args = append(args, "--user", user)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := c.CtrCommand(ctx, append(append(args, id), argv...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if code := exitCode(err); code != 0 {
		return strings.TrimSpace(stdout.String() + stderr.String()), code
	}
	return strings.TrimSpace(stdout.String()), 0
}

// mustExec is execAs that fails t unless argv exits 0.
func mustExec(t *testing.T, c *harness.Containerd, id, user string, argv ...string) string {
	t.Helper()
	out, code := execAs(t, c, id, user, argv...)
	if code != 0 {
		t.Fatalf("exec %q as %q in %s: exit status %d: %s", argv, user, id, code, out)
	}
	return out
}

// assertOneEntry fails t unless each of /etc/passwd, /etc/group and
// /etc/shadow of container id has exactly one line for the user dev
// (uid and gid 4242), and the shadow one is locked.
func assertOneEntry(t *testing.T, c *harness.Containerd, id, when string) {
	t.Helper()
	got := mustExec(t, c, id, "0", "sh", "-c",
		`printf '%s %s %s %s ' $(grep -c '^dev:' /etc/passwd) $(grep -c ':x:4242:' /etc/passwd) $(grep -c '^dev:' /etc/group) $(grep -c '^dev:' /etc/shadow); grep '^dev:' /etc/shadow | cut -d: -f2`)
	if got != "1 1 1 1 !" {
		t.Errorf("%s: passwd lines for dev and for uid 4242, group lines, shadow lines, shadow password: %q, want \"1 1 1 1 !\"", when, got)
	}
}

func TestExecUser(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, _, _ := shimContainerd(t, v)
			img := harness.ImportDebian(t, c)
			removeAtEnd(t, c, "eu", "eunosudo")

			// The init runs as the uid (the image's config says "User":
			// "4242", as `--user 4242` would; ctr 1.6's run has no
			// --user) and gets the user's HOME: the user is there before
			// the runtime creates the init.
			// containerd's default spec sets no_new_privs, under which
			// no setuid program (sudo) works: --allow-new-privs, as
			// Docker and Kubernetes run containers by default.
			c.MustCtr("run", "-d", "--runtime", runtimeName, "--allow-new-privs",
				"--annotation", annExecUser+"="+execUser, "--annotation", annExecUserSudo+"=true",
				harness.DebianUserRef, "eu", "sh", "-c", `echo "$HOME $(id -un) $(id -u)" > /tmp/init; exec sleep 600`)
			c.WaitStatus(t, "eu", "RUNNING")
			if got := waitFile(t, c, "eu", "/tmp/init"); got != "/home/dev dev 4242" {
				t.Errorf("the init's HOME, name and uid: %q, want \"/home/dev dev 4242\"", got)
			}
			if e := waitShimLog(c, "exec user provisioned", "container", "eu", 10*time.Second); e == nil {
				t.Errorf("the shim's log does not say the user was provisioned in eu")
			} else if e["passwd"] != "created" || e["sudo"] != "written" || e["home"] != "created" {
				t.Errorf("provisioning of eu: passwd %q, home %q, sudo %q; want created, created, written", e["passwd"], e["home"], e["sudo"])
			}

			for i := 0; i < 3; i++ {
				if got := mustExec(t, c, "eu", "4242", "whoami"); got != "dev" {
					t.Errorf("whoami as 4242: %q, want dev", got)
				}
			}
			if got := mustExec(t, c, "eu", "4242", "sh", "-c", `echo "$HOME"; id -un; stat -c '%u:%g %a' "$HOME"`); got != "/home/dev\ndev\n4242:4242 700" {
				t.Errorf("HOME, id -un and the home's owner and mode as 4242: %q", got)
			}
			if out, code := execAs(t, c, "eu", "4242", "sudo", "-n", "true"); code != 0 {
				t.Errorf("sudo -n true as 4242 with exec-user.sudo=true: exit status %d: %s", code, out)
			}
			assertOneEntry(t, c, "eu", "after create and execs")

			// A uid nobody configured runs as runc runs it: no name,
			// HOME=/, and no entry invented.
			if got, code := execAs(t, c, "eu", "4243", "sh", "-c", `echo "$HOME"; id -un`); code == 0 || !strings.HasPrefix(got, "/\n") {
				t.Errorf("as the unknown uid 4243: exit status %d, output %q; want HOME=/ and id -un failing", code, got)
			}
			if got := mustExec(t, c, "eu", "", "sh", "-c", "grep -c ':4243:' /etc/passwd || true"); got != "0" {
				t.Errorf("an entry was invented for uid 4243: %q", got)
			}

			// A restart of the container (task deleted, started again
			// on the same snapshot) keeps one entry each.
			c.MustCtr("task", "kill", "-s", "SIGKILL", "eu")
			c.WaitStatus(t, "eu", "STOPPED")
			c.MustCtr("task", "rm", "eu")
			c.MustCtr("task", "start", "-d", "eu")
			c.WaitStatus(t, "eu", "RUNNING")
			assertOneEntry(t, c, "eu", "after a restart")
			if got := mustExec(t, c, "eu", "4242", "sh", "-c", `whoami; echo "$HOME"`); got != "dev\n/home/dev" {
				t.Errorf("after a restart, whoami and HOME as 4242: %q", got)
			}
			c.MustCtr("task", "kill", "-s", "SIGKILL", "eu")
			c.WaitStatus(t, "eu", "STOPPED")
			c.MustCtr("task", "rm", "eu")

			// Without exec-user.sudo the user has no sudo.
			c.MustCtr("run", "-d", "--runtime", runtimeName, "--allow-new-privs", "--annotation", annExecUser+"="+execUser,
				img, "eunosudo", "sleep", "600")
			c.WaitStatus(t, "eunosudo", "RUNNING")
			if got := mustExec(t, c, "eunosudo", "4242", "whoami"); got != "dev" {
				t.Errorf("whoami as 4242 without sudo: %q", got)
			}
			if out, code := execAs(t, c, "eunosudo", "4242", "sudo", "-n", "true"); code == 0 {
				t.Errorf("sudo -n true as 4242 without exec-user.sudo worked: %s", out)
			}
			if got := mustExec(t, c, "eunosudo", "", "sh", "-c", "ls /etc/sudoers.d"); strings.Contains(got, "cocoon") {
				t.Errorf("a sudoers drop-in without exec-user.sudo: %q", got)
			}
			c.MustCtr("task", "kill", "-s", "SIGKILL", "eunosudo")
			c.WaitStatus(t, "eunosudo", "STOPPED")
			c.MustCtr("task", "rm", "eunosudo")
			c.WaitNoShim(t)
		})
	}
}

// A required user that cannot be provisioned (its name is Debian's
// daemon, uid 1) fails the create with the reason, and leaves no shim, VM
// or state behind.
func TestExecUserRequiredImpossible(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, _, _ := shimContainerd(t, v)
			img := harness.ImportDebian(t, c)
			removeAtEnd(t, c, "eubad")
			out, err := c.Ctr("run", "--rm", "--runtime", runtimeName,
				"--annotation", annExecUser+"=daemon:4242:4242", "--annotation", annExecUserNeeded+"=true",
				img, "eubad", "true")
			if err == nil {
				t.Fatalf("ctr run with an impossible required exec user worked:\n%s", out)
			}
			if msg := err.Error(); !strings.Contains(msg, "exec user daemon") || !strings.Contains(msg, "daemon is uid 1") {
				t.Errorf("the error does not name the user and the cause:\n%s", msg)
			}
			t.Logf("containerd %s refused the create: %v", v, err)
			c.WaitNoShim(t)
			_, _ = c.Ctr("container", "rm", "eubad")

			// A read-only root cannot take the user.
			_, err = c.Ctr("run", "--rm", "--runtime", runtimeName, "--read-only",
				"--annotation", annExecUser+"="+execUser, "--annotation", annExecUserNeeded+"=true",
				img, "eubad", "true")
			if err == nil || !strings.Contains(err.Error(), "read-only") {
				t.Errorf("a required exec user on a read-only root: %v", err)
			}
			c.WaitNoShim(t)
			_, _ = c.Ctr("container", "rm", "eubad")

			// A malformed annotation is refused before anything boots.
			_, err = c.Ctr("run", "--rm", "--runtime", runtimeName,
				"--annotation", annExecUser+"=dev:4242:x", img, "eubad", "true")
			if err == nil || !strings.Contains(err.Error(), `gid "x" is not a number`) {
				t.Errorf("a malformed exec user annotation: %v", err)
			}
			c.WaitNoShim(t)
		})
	}
}

// waitFile waits (30 s at most) for path in container id to be non-empty
// and returns it.
func waitFile(t *testing.T, c *harness.Containerd, id, path string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, code := execAs(t, c, id, "", "cat", path)
		if code == 0 && out != "" {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s: %s", path, id, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A container restored from a checkpoint made before the user was
// configured gets it before its processes are thawed (containerd 2.4:
// the restore is the shim's own path, whatever containerd's version).
func TestExecUserAfterRestore(t *testing.T) {
	c, img, stateDir := shimContainerd(t, "2.4")
	removeAtEnd(t, c, "eurst")
	c.MustCtr("run", "-d", "--runtime", runtimeName, img, "eurst", "sleep", "600")
	c.WaitStatus(t, "eurst", "RUNNING")
	if out, code := execAs(t, c, "eurst", "4242", "id", "-un"); code == 0 {
		t.Fatalf("uid 4242 has a name before the user was configured: %q", out)
	}
	c.MustCtr("container", "checkpoint", "--task", "eurst", "checkpoint/eurst:1")
	killAndRemove(t, c, "eurst")

	// The shims read the configuration at each create: the restore's
	// sees the user.
	cfg := filepath.Join(filepath.Dir(stateDir), "config.toml")
	if err := os.WriteFile(cfg, []byte("[exec_user]\nuser = \"dev:4242:4242\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.MustCtr("container", "restore", "--live", "eurst", "checkpoint/eurst:1")
	c.WaitStatus(t, "eurst", "RUNNING")
	if got := mustExec(t, c, "eurst", "4242", "sh", "-c", `id -un; echo "$HOME"`); got != "dev\n/home/dev" {
		t.Errorf("as 4242 after the restore: %q, want dev and /home/dev", got)
	}
	if e := waitShimLog(c, "exec user provisioned", "container", "eurst", 10*time.Second); e == nil || e["passwd"] != "created" {
		t.Errorf("the shim's log does not say the user was provisioned in the restored container: %v", e)
	}
	killAndRemove(t, c, "eurst")
	c.WaitNoShim(t)
}
