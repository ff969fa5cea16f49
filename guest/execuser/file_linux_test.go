//go:build linux

package execuser

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openTestDir opens dir for the file helpers.
func openTestDir(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func TestReplaceChild(t *testing.T) {
	dir := t.TempDir()
	fd := openTestDir(t, dir)
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := readChild(fd, "f", "/f")
	if err != nil || !f.exists || string(f.data) != "old\n" || f.mode() != 0o600 {
		t.Fatalf("readChild: %+v, %v", f, err)
	}
	if err := replaceChild(fd, "f", "/f", []byte("new\n"), f, 0o640, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "new\n" {
		t.Errorf("content %q", b)
	}
	if fi, _ := os.Stat(p); fi.Mode() != 0o640 {
		t.Errorf("mode %v", fi.Mode())
	}
	noTemporaries(t, dir, ".")
}

func TestReplaceChildChanged(t *testing.T) {
	dir := t.TempDir()
	fd := openTestDir(t, dir)
	p := filepath.Join(dir, "f")
	for name, change := range map[string]func(t *testing.T){
		"edited in place": func(t *testing.T) {
			if err := os.WriteFile(p, []byte("theirs, longer\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		"replaced": func(t *testing.T) {
			os.Remove(p)
			if err := os.WriteFile(p, []byte("old\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		"removed": func(t *testing.T) { os.Remove(p) },
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(p, []byte("old\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := readChild(fd, "f", "/f")
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond) // a later mtime
			change(t)
			before, _ := os.ReadFile(p)
			err = replaceChild(fd, "f", "/f", []byte("new\n"), f, 0o600, os.Getuid(), os.Getgid())
			if err == nil || errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "/f ") {
				t.Errorf("error %v, want a plain one naming /f", err)
			}
			if after, _ := os.ReadFile(p); string(after) != string(before) {
				t.Errorf("content %q, want %q left", after, before)
			}
			noTemporaries(t, dir, ".")
		})
	}
	t.Run("now a symlink", func(t *testing.T) {
		if err := os.WriteFile(p, []byte("old\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := readChild(fd, "f", "/f")
		if err != nil {
			t.Fatal(err)
		}
		os.Remove(p)
		if err := os.Symlink("/etc/passwd", p); err != nil {
			t.Fatal(err)
		}
		err = replaceChild(fd, "f", "/f", []byte("new\n"), f, 0o600, os.Getuid(), os.Getgid())
		if !errors.Is(err, ErrUnsafe) {
			t.Errorf("error %v, want ErrUnsafe", err)
		}
		if fi, err := os.Lstat(p); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("the symlink was replaced: %v, %v", fi, err)
		}
		noTemporaries(t, dir, ".")
	})
	t.Run("appeared", func(t *testing.T) {
		os.Remove(p)
		f, err := readChild(fd, "f", "/f")
		if err != nil || f.exists {
			t.Fatalf("readChild: %+v, %v", f, err)
		}
		if err := os.WriteFile(p, []byte("theirs\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		err = replaceChild(fd, "f", "/f", []byte("new\n"), f, 0o600, os.Getuid(), os.Getgid())
		if err == nil || !strings.Contains(err.Error(), "appeared") {
			t.Errorf("error %v", err)
		}
		if b, _ := os.ReadFile(p); string(b) != "theirs\n" {
			t.Errorf("content %q", b)
		}
	})
}

func TestRemoveChild(t *testing.T) {
	dir := t.TempDir()
	fd := openTestDir(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if removed, err := removeChild(fd, "f", "/f"); !removed || err != nil {
		t.Errorf("removeChild: %v, %v", removed, err)
	}
	if removed, err := removeChild(fd, "f", "/f"); removed || err != nil {
		t.Errorf("removeChild again: %v, %v", removed, err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	if _, err := removeChild(fd, "l", "/l"); !errors.Is(err, ErrUnsafe) {
		t.Errorf("removeChild(symlink): %v, want ErrUnsafe", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "l")); err != nil {
		t.Errorf("the symlink was removed: %v", err)
	}
}
