//go:build linux

package execuser

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// testUser is a user no host has, so that a provisioning that escaped its
// root would leave traces the tests can see.
const testUser = "cocoon-execuser-test"

func TestProvisionUnsafeFiles(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, root string)
		sudo  bool
		want  string
	}{
		{"passwd to the host's hostname", func(t *testing.T, root string) {
			symlink(t, "/etc/hostname", root, "etc/passwd")
		}, false, "/etc/passwd is a symlink"},
		{"passwd climbing out", func(t *testing.T, root string) {
			symlink(t, "../../../../../../../../etc/passwd", root, "etc/passwd")
		}, false, "/etc/passwd is a symlink"},
		{"passwd to a file in the root", func(t *testing.T, root string) {
			writeFile(t, root, "lib/passwd", debianPasswd, 0o644, 0, 0)
			symlink(t, "../lib/passwd", root, "etc/passwd")
		}, false, "/etc/passwd is a symlink"},
		{"passwd a directory", func(t *testing.T, root string) {
			os.Remove(filepath.Join(root, "etc/passwd"))
			mkdir(t, root, "etc/passwd")
		}, false, "/etc/passwd is a directory"},
		{"passwd a FIFO", func(t *testing.T, root string) {
			os.Remove(filepath.Join(root, "etc/passwd"))
			if err := syscall.Mkfifo(filepath.Join(root, "etc/passwd"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, false, "/etc/passwd is not a regular file"},
		{"group", func(t *testing.T, root string) {
			symlink(t, "/etc/group", root, "etc/group")
		}, false, "/etc/group is a symlink"},
		{"shadow", func(t *testing.T, root string) {
			symlink(t, "/etc/shadow", root, "etc/shadow")
		}, false, "/etc/shadow is a symlink"},
		{"dangling shadow", func(t *testing.T, root string) {
			symlink(t, "/nowhere", root, "etc/shadow")
		}, false, "/etc/shadow is a symlink"},
		{"drop-in", func(t *testing.T, root string) {
			symlink(t, "/etc/sudoers", root, "etc/sudoers.d/cocoon-exec-user")
		}, true, SudoersDropIn + " is a symlink"},
		{"drop-in removed", func(t *testing.T, root string) {
			symlink(t, "/etc/sudoers", root, "etc/sudoers.d/cocoon-exec-user")
		}, false, SudoersDropIn + " is a symlink"},
		{"drop-in a directory", func(t *testing.T, root string) {
			mkdir(t, root, "etc/sudoers.d/cocoon-exec-user")
		}, true, SudoersDropIn + " is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := debianRoot(t)
			tc.setup(t, root)
			host := hostState(t, "/home/"+testUser, "/"+testUser)
			_, err := provision(t, root, mustParse(t, testUser+":4242:4242"), Options{Sudo: tc.sudo})
			if !errors.Is(err, ErrUnsafe) {
				t.Fatalf("error %v, want ErrUnsafe", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want %q in it", err, tc.want)
			}
			if got := hostState(t, "/home/"+testUser, "/"+testUser); got != host {
				t.Errorf("the host changed:\n%s\nwas:\n%s", got, host)
			}
			noTemporaries(t, root, "etc", "etc/sudoers.d")
		})
	}
}

func TestProvisionUnsafeLeavesSymlink(t *testing.T) {
	root := debianRoot(t)
	symlink(t, "/etc/hostname", root, "etc/passwd")
	before := snapshot(t, root)
	if _, err := provision(t, root, mustParse(t, testUser+":4242:4242"), Options{}); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("error %v, want ErrUnsafe", err)
	}
	if after := snapshot(t, root); after != before {
		t.Errorf("the root changed:\n%s\nwas:\n%s", after, before)
	}
}

func TestProvisionEtcToSlash(t *testing.T) {
	root := debianRoot(t)
	// The image's /etc is a symlink to "/": its files are the root's.
	etc := filepath.Join(root, "etc")
	for _, f := range []string{"passwd", "group", "shadow", "sudoers"} {
		if err := os.Rename(filepath.Join(etc, f), filepath.Join(root, f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(etc); err != nil {
		t.Fatal(err)
	}
	symlink(t, "/", root, "etc")
	host := hostState(t, "/home/"+testUser, "/"+testUser)
	beside := listDir(t, filepath.Dir(root))
	rep, err := provision(t, root, mustParse(t, testUser+":4242:4242"), Options{Sudo: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Passwd != Created || rep.Group != Created || rep.Shadow != Created || rep.Home != Created || rep.Sudo != Written {
		t.Errorf("report %+v", rep)
	}
	if got := hostState(t, "/home/"+testUser, "/"+testUser); got != host {
		t.Errorf("the host changed:\n%s\nwas:\n%s", got, host)
	}
	if got := listDir(t, filepath.Dir(root)); got != beside {
		t.Errorf("beside the root: %s, was %s", got, beside)
	}
	if n := countLines(read(t, root, "passwd"), testUser+":"); n != 1 {
		t.Errorf("the root's passwd has %d lines for the user", n)
	}
	checkStat(t, root, "sudoers.d", os.ModeDir|0o755, 0, 0)
	checkStat(t, root, "sudoers.d/cocoon-exec-user", 0o440, 0, 0)
	checkStat(t, root, "home/"+testUser, os.ModeDir|0o700, 4242, 4242)
	checkStat(t, root, "etc", os.ModeSymlink|0o777, 0, 0)
	if rep.ByUID == nil || rep.ByUID.Name != testUser {
		t.Errorf("lookup by uid: %+v", rep.ByUID)
	}
}

func TestProvisionHomeSymlinks(t *testing.T) {
	for _, target := range []string{"/", "../../../../../../..", "/etc/../../.."} {
		t.Run(target, func(t *testing.T) {
			root := debianRoot(t)
			os.Remove(filepath.Join(root, "home"))
			symlink(t, target, root, "home")
			host := hostState(t, "/home/"+testUser, "/"+testUser)
			rep, err := provision(t, root, mustParse(t, testUser+":4242:4242"), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Home != Created {
				t.Errorf("home %s", rep.Home)
			}
			// /home/<user> resolves to the root's /<user>.
			checkStat(t, root, testUser, os.ModeDir|0o700, 4242, 4242)
			if got := hostState(t, "/home/"+testUser, "/"+testUser); got != host {
				t.Errorf("the host changed:\n%s\nwas:\n%s", got, host)
			}
		})
	}
}

func TestProvisionHomeParentDangling(t *testing.T) {
	root := debianRoot(t)
	symlink(t, "/nowhere", root, "home")
	_, err := provision(t, root, mustParse(t, testUser+":4242:4242"), Options{})
	if err == nil || !strings.Contains(err.Error(), "home: /home is there but leads nowhere") {
		t.Errorf("error %v", err)
	}
	if _, err := os.Lstat("/nowhere"); !os.IsNotExist(err) {
		t.Errorf("the host got /nowhere: %v", err)
	}
}

func TestProvisionHomeDanglingSymlink(t *testing.T) {
	root := debianRoot(t)
	symlink(t, "/"+testUser+"-nowhere", root, "home/"+testUser)
	rep, err := provision(t, root, mustParse(t, testUser+":4242:4242"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Home != Existed || !hasNote(rep, "symlink that leads nowhere") {
		t.Errorf("report %+v", rep)
	}
	if _, err := os.Lstat("/" + testUser + "-nowhere"); !os.IsNotExist(err) {
		t.Errorf("the host got /%s-nowhere: %v", testUser, err)
	}
}

func TestProvisionProcRoot(t *testing.T) {
	// A magic link is refused, not followed to the agent's own root.
	root := debianRoot(t)
	os.RemoveAll(filepath.Join(root, "etc"))
	symlink(t, "/proc/self/root/etc", root, "etc")
	mkdir(t, root, "proc")
	if err := syscall.Mount("proc", filepath.Join(root, "proc"), "proc", 0, ""); err != nil {
		t.Skipf("mount proc: %v", err)
	}
	defer syscall.Unmount(filepath.Join(root, "proc"), syscall.MNT_DETACH)
	host := hostState(t, "/home/"+testUser, "/"+testUser)
	_, err := provision(t, root, mustParse(t, testUser+":4242:4242"), Options{})
	if !errors.Is(err, ErrUnsafe) || !errors.Is(err, syscall.ELOOP) {
		t.Errorf("error %v, want ErrUnsafe and ELOOP", err)
	}
	if got := hostState(t, "/home/"+testUser, "/"+testUser); got != host {
		t.Errorf("the host changed:\n%s\nwas:\n%s", got, host)
	}
}

// symlink makes path under root a symlink to target, replacing what is
// there.
func symlink(t *testing.T, target, root, path string) {
	t.Helper()
	p := filepath.Join(root, path)
	os.Remove(p)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// mkdir makes directory path under root.
func mkdir(t *testing.T, root, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, path), 0o755); err != nil {
		t.Fatal(err)
	}
}

// listDir returns the names in dir.
func listDir(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}
