//go:build linux

package execuser

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestProvisionNoSudo(t *testing.T) {
	for name, setup := range map[string]func(t *testing.T, root string){
		"missing": func(t *testing.T, root string) {
			os.Remove(filepath.Join(root, "usr/bin/sudo"))
		},
		"not executable": func(t *testing.T, root string) {
			writeFile(t, root, "usr/bin/sudo", "", 0o644, 0, 0)
		},
		"a directory": func(t *testing.T, root string) {
			os.Remove(filepath.Join(root, "usr/bin/sudo"))
			mkdir(t, root, "usr/bin/sudo")
		},
		"a symlink out": func(t *testing.T, root string) {
			// Resolved in the root, /bin/sh of the host is not there.
			symlink(t, "/bin/sh-of-nowhere", root, "usr/bin/sudo")
		},
	} {
		t.Run(name, func(t *testing.T) {
			root := debianRoot(t)
			setup(t, root)
			rep, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{Sudo: true})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Sudo != NoSudo || rep.Passwd != Created {
				t.Errorf("report %+v", rep)
			}
			entries, _ := os.ReadDir(filepath.Join(root, "etc/sudoers.d"))
			if len(entries) != 1 || entries[0].Name() != "README" {
				t.Errorf("sudoers.d holds %v, want only README", entries)
			}
		})
	}
}

func TestProvisionSudoElsewhere(t *testing.T) {
	for _, path := range []string{"bin/sudo", "usr/sbin/sudo"} {
		t.Run(path, func(t *testing.T) {
			root := debianRoot(t)
			os.Remove(filepath.Join(root, "usr/bin/sudo"))
			writeFile(t, root, path, "", 0o700, 0, 0)
			rep, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{Sudo: true})
			if err != nil || rep.Sudo != Written {
				t.Errorf("report %+v, %v", rep, err)
			}
		})
	}
	t.Run("/bin a symlink", func(t *testing.T) {
		root := debianRoot(t)
		writeFile(t, root, "usr/bin/sudo", "", 0o755, 0, 0)
		symlink(t, "usr/bin", root, "bin")
		os.Remove(filepath.Join(root, "usr/bin/sudo"))
		writeFile(t, root, "usr/sbin/sudo", "", 0o755, 0, 0)
		symlink(t, "/usr/sbin/sudo", root, "usr/bin/sudo")
		rep, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{Sudo: true})
		if err != nil || rep.Sudo != Written {
			t.Errorf("report %+v, %v", rep, err)
		}
	})
}

func TestProvisionSudoOnOff(t *testing.T) {
	root := debianRoot(t)
	u := mustParse(t, "dev:4242:4242")
	rep, err := provision(t, root, u, Options{Sudo: true})
	if err != nil || rep.Sudo != Written {
		t.Fatalf("report %+v, %v", rep, err)
	}
	rep, err = provision(t, root, u, Options{})
	if err != nil || rep.Sudo != Removed {
		t.Fatalf("report %+v, %v", rep, err)
	}
	if _, err := os.Lstat(filepath.Join(root, SudoersDropIn)); !os.IsNotExist(err) {
		t.Errorf("drop-in: %v, want it removed", err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/sudoers.d/README")); err != nil {
		t.Errorf("README: %v", err)
	}
	rep, err = provision(t, root, u, Options{})
	if err != nil || rep.Sudo != Off {
		t.Fatalf("report %+v, %v", rep, err)
	}
}

func TestProvisionSudoRewritten(t *testing.T) {
	root := debianRoot(t)
	writeFile(t, root, SudoersDropIn, "someone ALL=(ALL) ALL\n", 0o644, 1, 1)
	rep, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{Sudo: true})
	if err != nil || rep.Sudo != Written {
		t.Fatalf("report %+v, %v", rep, err)
	}
	checkStat(t, root, SudoersDropIn, 0o440, 0, 0)
	if got, want := read(t, root, SudoersDropIn), "dev ALL=(ALL:ALL) NOPASSWD: ALL\n"; got != want {
		t.Errorf("drop-in %q, want %q", got, want)
	}
	// The right content with the wrong mode is rewritten too.
	if err := os.Chmod(filepath.Join(root, SudoersDropIn), 0o666); err != nil {
		t.Fatal(err)
	}
	rep, err = provision(t, root, mustParse(t, "dev:4242:4242"), Options{Sudo: true})
	if err != nil || rep.Sudo != Written {
		t.Fatalf("report %+v, %v", rep, err)
	}
	checkStat(t, root, SudoersDropIn, 0o440, 0, 0)
}

func TestProvisionSudoNoIncludeDir(t *testing.T) {
	for name, sudoers := range map[string]*string{
		"not included": new("Defaults env_reset\nroot ALL=(ALL:ALL) ALL\n"),
		"no sudoers":   nil,
	} {
		t.Run(name, func(t *testing.T) {
			root := debianRoot(t)
			u := mustParse(t, "dev:4242:4242")
			if _, err := provision(t, root, u, Options{Sudo: true}); err != nil {
				t.Fatal(err)
			}
			if sudoers == nil {
				os.Remove(filepath.Join(root, "etc/sudoers"))
			} else {
				writeFile(t, root, "etc/sudoers", *sudoers, 0o440, 0, 0)
			}
			_, err := provision(t, root, u, Options{Sudo: true})
			if err == nil || !strings.Contains(err.Error(), "does not include /etc/sudoers.d") {
				t.Errorf("error %v", err)
			}
			if _, err := os.Lstat(filepath.Join(root, SudoersDropIn)); !os.IsNotExist(err) {
				t.Errorf("drop-in: %v, want it removed", err)
			}
		})
	}
	t.Run("nothing written", func(t *testing.T) {
		root := debianRoot(t)
		writeFile(t, root, "etc/sudoers", "root ALL=(ALL:ALL) ALL\n", 0o440, 0, 0)
		before := snapshot(t, root)
		if _, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{Sudo: true}); err == nil {
			t.Fatal("no error")
		}
		if after := snapshot(t, root); after != before {
			t.Errorf("the root changed:\n%s\nwas:\n%s", after, before)
		}
	})
	t.Run("#includedir", func(t *testing.T) {
		root := debianRoot(t)
		writeFile(t, root, "etc/sudoers", "root ALL=(ALL:ALL) ALL\n#includedir /etc/sudoers.d\n", 0o440, 0, 0)
		rep, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{Sudo: true})
		if err != nil || rep.Sudo != Written {
			t.Errorf("report %+v, %v", rep, err)
		}
	})
}

func TestProvisionSudoersDirMissing(t *testing.T) {
	root := debianRoot(t)
	if err := os.RemoveAll(filepath.Join(root, "etc/sudoers.d")); err != nil {
		t.Fatal(err)
	}
	rep, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{Sudo: true})
	if err != nil || rep.Sudo != Written {
		t.Fatalf("report %+v, %v", rep, err)
	}
	checkStat(t, root, "etc/sudoers.d", os.ModeDir|0o755, 0, 0)
	checkStat(t, root, SudoersDropIn, 0o440, 0, 0)
}

func TestProvisionSudoAliasName(t *testing.T) {
	root := debianRoot(t)
	rep, err := provision(t, root, mustParse(t, "ALL:4242:4242"), Options{Sudo: true})
	if err != nil || rep.Sudo != Written {
		t.Fatalf("report %+v, %v", rep, err)
	}
	if got, want := read(t, root, SudoersDropIn), "#4242 ALL=(ALL:ALL) NOPASSWD: ALL\n"; got != want {
		t.Errorf("drop-in %q, want %q", got, want)
	}
	if !hasNote(rep, `sudo would not read the name "ALL" as a user`) {
		t.Errorf("notes %q", rep.Notes)
	}
}
