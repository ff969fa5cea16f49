package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// upperdirOption finds the upperdir in `ctr snapshots mounts` output.
var upperdirOption = regexp.MustCompile(`upperdir=([^,\s]+)`)

// snapshotDirs returns the upperdir and the lowerdirs of snapshot key.
func snapshotDirs(t *testing.T, c *harness.Containerd, key string) (upper string, lowers []string) {
	t.Helper()
	out := c.MustCtr("snapshots", "mounts", "/mnt", key)
	m := upperdirOption.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no upperdir for snapshot %s in %q", key, out)
	}
	if l := regexp.MustCompile(`lowerdir=([^,\s]+)`).FindStringSubmatch(out); l != nil {
		lowers = strings.Split(l[1], ":")
	}
	return m[1], lowers
}

// listing is what dir holds: every path with its type, mode, owner, size
// and device, without following symlinks.
func listing(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = fmt.Sprintf("%s %d:%d %d %d", fi.Mode(), st.Uid, st.Gid, st.Size, st.Rdev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCopyBackHostile is fault case 8 through real containerd, ctr and a
// VM: a container without CAP_MKNOD leaves a hostile tree in its
// writable layer. A symlink to /etc with a file written "through" it
// comes back as what the container saw (the symlink, and the file in the
// container's own /etc), never into the host's /etc; a device node it
// gave a new name (ln needs no capability) is refused, while the one the
// snapshot held before stays; the shim's log says what was refused; and
// nothing outside the snapshot changes. A container with CAP_MKNOD gets
// its device node back, as under runc. (Names forged in the stream and a
// diff over the bound are TestCopyBackHostile and TestCopyBackFailures
// in runtime/rootfs: the released agent cannot be made to send them.)
func TestCopyBackHostile(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, stateDir := shimContainerd(t, v)
			removeAtEnd(t, c, "hostile", "mknod")
			const marker = "cocoon-copy-back-through-a-symlink"
			hostFile := filepath.Join("/etc", marker)
			if _, err := os.Lstat(hostFile); err == nil {
				t.Fatalf("%s exists before the test", hostFile)
			}

			// "--": ctr container create would take -c for its --config.
			c.MustCtr("container", "create", "--runtime", runtimeName, "--cap-drop", "CAP_MKNOD", img, "hostile",
				"--", "sh", "-c", "ln -s /etc /hostetc && echo pwned > /hostetc/"+marker+
					" && ln /seeded-null /linked-null && ! mknod /made-null c 1 3 && echo data > /file")
			upper, lowers := snapshotDirs(t, c, "hostile")
			// The snapshot's upperdir holds a device node before the
			// container runs (an earlier, privileged run's).
			if err := unix.Mknod(filepath.Join(upper, "seeded-null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}
			lowersBefore := map[string]map[string]string{}
			for _, l := range lowers {
				lowersBefore[l] = listing(t, l)
			}
			c.MustCtr("task", "start", "-d", "hostile")
			c.WaitStatus(t, "hostile", "STOPPED")
			if out := c.MustCtr("task", "ls"); !regexp.MustCompile(`(?m)^hostile\s+\d+\s+STOPPED`).MatchString(out) {
				t.Fatalf("task ls: %s", out)
			}
			c.MustCtr("task", "rm", "hostile")

			if _, err := os.Lstat(hostFile); !errors.Is(err, os.ErrNotExist) {
				os.Remove(hostFile)
				t.Fatalf("the container's write through its symlink reached the host's /etc: %v", err)
			}
			got := listing(t, upper)
			for name, want := range map[string]string{
				"hostetc":       "Lrwxrwxrwx",
				"etc/" + marker: "-rw-r--r--",
				"seeded-null":   "Dcrw-r--r-- 0:0 0 259", // as it was (1:3, mknod's umask): a copy-up keeps it
				"file":          "-rw-r--r--",
			} {
				if !strings.HasPrefix(got[name], want) {
					t.Errorf("upperdir %s: %q, want %s...", name, got[name], want)
				}
			}
			if target, _ := os.Readlink(filepath.Join(upper, "hostetc")); target != "/etc" {
				t.Errorf("hostetc -> %q, want /etc", target)
			}
			if s, ok := got["linked-null"]; ok {
				t.Errorf("a device node the container made without CAP_MKNOD came back: %s", s)
			}
			for _, l := range lowers {
				if after := listing(t, l); !mapsEqual(after, lowersBefore[l]) {
					t.Errorf("image layer %s changed", l)
				}
			}
			for _, sib := range []string{upper + ".cocoon-new", upper + ".cocoon-old"} {
				if _, err := os.Lstat(sib); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left next to the upperdir", sib)
				}
			}
			log := c.Log()
			if !strings.Contains(log, "could not have written were left out") || !strings.Contains(log, "device node without CAP_MKNOD") ||
				!strings.Contains(log, "linked-null") {
				t.Errorf("the shim's log does not say what was refused:\n%s", tail(log, 40))
			}
			c.MustCtr("container", "rm", "hostile")

			// With CAP_MKNOD (containerd's default set), as under runc.
			// (ctr run deletes the task, and so copies the layer back,
			// once the command exited.)
			c.MustCtr("run", "--runtime", runtimeName, img, "mknod", "mknod", "/made-null", "c", "1", "3")
			upper, _ = snapshotDirs(t, c, "mknod")
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(upper, "made-null"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(1, 3) {
				t.Errorf("the device node of a container with CAP_MKNOD: %v, mode %o rdev %d", err, st.Mode, st.Rdev)
			}
			c.MustCtr("container", "rm", "mknod")
			leakAudit(t, c, filepath.Dir(stateDir))
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
