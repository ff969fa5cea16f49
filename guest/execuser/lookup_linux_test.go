//go:build linux

package execuser

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestLookup(t *testing.T) {
	root := t.TempDir()
	passwd := "# comment\n" +
		"+dev:x:1:1::/plus:/bin/sh\n" +
		"-dev:x:2:2::/minus:/bin/sh\n" +
		"dev:x:bad:3::/bad:/bin/sh\n" +
		"dev:x:4242:4242::/home/dev:/bin/bash\n" +
		"dev:x:5000:5000::/second:/bin/sh\n" +
		"alice:x:4242:100::/home/alice:/bin/sh\n"
	if err := os.MkdirAll(filepath.Join(root, "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "lib/passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	// The container follows symlinks, inside its root: so do lookups.
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/lib/passwd", filepath.Join(root, "etc/passwd")); err != nil {
		t.Fatal(err)
	}
	dev := Entry{"dev", 4242, 4242, "/home/dev", "/bin/bash"}
	if e, err := LookupName(root, "dev"); err != nil || e == nil || *e != dev {
		t.Errorf("LookupName(dev) = %+v, %v; want %+v", e, err, dev)
	}
	if e, err := LookupUID(root, 4242); err != nil || e == nil || *e != dev {
		t.Errorf("LookupUID(4242) = %+v, %v; want %+v", e, err, dev)
	}
	for _, uid := range []uint32{1, 2, 3, 4243} {
		if e, err := LookupUID(root, uid); err != nil || e != nil {
			t.Errorf("LookupUID(%d) = %+v, %v; want none", uid, e, err)
		}
	}
	if e, err := LookupName(root, "bob"); err != nil || e != nil {
		t.Errorf("LookupName(bob) = %+v, %v; want none", e, err)
	}
}

func TestLookupMissing(t *testing.T) {
	root := t.TempDir()
	if e, err := LookupName(root, "root"); err != nil || e != nil {
		t.Errorf("no etc: %+v, %v", e, err)
	}
	if err := os.Symlink("../../../../../../../../var/etc", filepath.Join(root, "etc")); err != nil {
		t.Fatal(err)
	}
	// Resolved in the root, etc is the root's /var/etc, whatever the host
	// has.
	if e, err := LookupName(root, "root"); err != nil || e != nil {
		t.Errorf("etc climbing out: %+v, %v; want none", e, err)
	}
	if err := os.MkdirAll(filepath.Join(root, "var/etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "var/etc/passwd"), []byte("root:x:0:0::/in-root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if e, err := LookupName(root, "root"); err != nil || e == nil || e.Home != "/in-root" {
		t.Errorf("etc climbing out: %+v, %v; want the root's /var/etc/passwd", e, err)
	}
	// A symlink loop is no entry, but an error.
	if err := os.Symlink("/loop", filepath.Join(root, "loop")); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(root, "etc"))
	if err := os.Symlink("/loop", filepath.Join(root, "etc")); err != nil {
		t.Fatal(err)
	}
	if _, err := LookupName(root, "root"); !errors.Is(err, ErrUnsafe) {
		t.Errorf("etc a loop: %v, want ErrUnsafe", err)
	}
	if _, err := LookupName(filepath.Join(root, "nowhere"), "root"); err == nil {
		t.Errorf("a missing root: no error")
	}
}

func TestLookupNotRegular(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc/passwd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := LookupUID(root, 0); !errors.Is(err, ErrUnsafe) {
		t.Errorf("passwd a directory: %v, want ErrUnsafe", err)
	}
}
