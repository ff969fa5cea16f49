//go:build linux

package execuser

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	debianPasswd = "root:x:0:0:root:/root:/bin/bash\n" +
		"daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	debianGroup = "root:x:0:\n" +
		"daemon:x:1:\n" +
		"shadow:x:42:\n" +
		"nogroup:x:65534:\n"
	debianShadow = "root:*:19000:0:99999:7:::\n" +
		"daemon:*:19000:0:99999:7:::\n" +
		"nobody:*:19000:0:99999:7:::\n"
	debianSudoers = "Defaults\tenv_reset\n" +
		"root\tALL=(ALL:ALL) ALL\n" +
		"%sudo\tALL=(ALL:ALL) ALL\n" +
		"@includedir /etc/sudoers.d\n"
)

// testDay is the day the tests' shadow lines are dated.
var testDay = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func TestMain(m *testing.M) {
	now = func() time.Time { return testDay }
	os.Exit(m.Run())
}

// needRoot skips a test that changes owners unless it runs as root.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to set owners")
	}
}

// writeFile writes path under root with mode and owner.
func writeFile(t *testing.T, root, path, content string, mode os.FileMode, uid, gid int) {
	t.Helper()
	p := filepath.Join(root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// debianRoot returns a root filesystem with Debian's passwd, group,
// shadow (0640 root:shadow) and sudoers, and sudo.
func debianRoot(t *testing.T) string {
	t.Helper()
	needRoot(t)
	root := t.TempDir()
	writeFile(t, root, "etc/passwd", debianPasswd, 0o644, 0, 0)
	writeFile(t, root, "etc/group", debianGroup, 0o644, 0, 42)
	writeFile(t, root, "etc/shadow", debianShadow, 0o640, 0, 42)
	writeFile(t, root, "etc/sudoers", debianSudoers, 0o440, 0, 0)
	writeFile(t, root, "etc/sudoers.d/README", "# drop-ins\n", 0o440, 0, 0)
	writeFile(t, root, "etc/hostname", "image\n", 0o644, 0, 0)
	writeFile(t, root, "usr/bin/sudo", "#!/bin/sh\n", 0o4755, 0, 0)
	if err := os.MkdirAll(filepath.Join(root, "home"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// read returns the content of path under root.
func read(t *testing.T, root, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkStat checks the mode (type and permissions) and owner of path
// under root, not following a symlink.
func checkStat(t *testing.T, root, path string, mode os.FileMode, uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(filepath.Join(root, path))
	if err != nil {
		t.Error(err)
		return
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode() != mode || st.Uid != uid || st.Gid != gid {
		t.Errorf("%s: %v %d:%d, want %v %d:%d", path, fi.Mode(), st.Uid, st.Gid, mode, uid, gid)
	}
}

// mustParse parses an exec user.
func mustParse(t *testing.T, s string) User {
	t.Helper()
	u, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// provision provisions u in root with a test's deadline.
func provision(t *testing.T, root string, u User, o Options) (Report, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return Provision(ctx, root, u, o)
}

// snapshot describes every file under dir: type, mode, owner, inode,
// content or symlink target. Two equal snapshots mean nothing changed.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(&b, "%s %v %d:%d ino %d", rel, fi.Mode(), st.Uid, st.Gid, st.Ino)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			fmt.Fprintf(&b, " -> %s", target)
		case fi.Mode().IsRegular():
			content, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %q", content)
		case fi.IsDir():
			// Its entries follow.
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// hostFiles are the host's files a provisioning that escaped its root
// would read or write.
var hostFiles = []string{"/etc/passwd", "/etc/group", "/etc/shadow", "/etc/hostname", "/etc/sudoers", SudoersDropIn}

// hostState describes the host's files a hostile root might point a
// provisioning at, and whether the names an escaped provisioning of the
// user would make exist.
func hostState(t *testing.T, names ...string) string {
	t.Helper()
	var b strings.Builder
	for _, p := range hostFiles {
		fi, err := os.Lstat(p)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", p, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		content, _ := os.ReadFile(p)
		fmt.Fprintf(&b, "%s %v %d:%d ino %d %v %q\n", p, fi.Mode(), st.Uid, st.Gid, st.Ino, fi.ModTime(), content)
	}
	for _, n := range append([]string{"/passwd", "/group", "/shadow", "/sudoers.d"}, names...) {
		_, err := os.Lstat(n)
		fmt.Fprintf(&b, "%s exists: %v\n", n, err == nil)
	}
	return b.String()
}

// countLines returns how many lines of content start with prefix.
func countLines(content, prefix string) int {
	n := 0
	for line := range strings.SplitSeq(content, "\n") {
		if strings.HasPrefix(line, prefix) {
			n++
		}
	}
	return n
}

// noTemporaries fails when a directory under root holds a temporary file.
func noTemporaries(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		entries, err := os.ReadDir(filepath.Join(root, d))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") {
				t.Errorf("%s: temporary file %s left", d, e.Name())
			}
		}
	}
}

// hasNote reports whether the report has a note containing s.
func hasNote(r Report, s string) bool {
	return slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, s) })
}
