package share

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/oci"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the share makes bind mounts: needs root")
	}
}

// fixture is a share with a host directory and file to bind.
type fixture struct {
	d              *Dir
	state          string
	hostDir, hostF string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	needRoot(t)
	base := t.TempDir()
	f := fixture{state: filepath.Join(base, "state"), hostDir: filepath.Join(base, "data"), hostF: filepath.Join(base, "hosts")}
	for _, dir := range []string{f.state, f.hostDir} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(f.hostDir, "in-dir"), []byte("dir\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.hostF, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := New(f.state)
	if err != nil {
		t.Fatal(err)
	}
	f.d = d
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
		if left, _ := MountsUnder(base); len(left) > 0 {
			t.Errorf("mounts left: %v", left)
		}
	})
	return f
}

func TestShareBinds(t *testing.T) {
	f := newFixture(t)
	err := f.d.Add("c1", []oci.Bind{
		{Index: 3, Source: f.hostDir, Destination: "/data"},
		{Index: 4, Source: f.hostF, Destination: "/etc/hosts", ReadOnly: true},
		{Index: 5, Source: f.hostDir, Destination: "/ro", ReadOnly: true, Recursive: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	root := f.d.Root()
	if b, err := os.ReadFile(filepath.Join(root, "c1/3/in-dir")); err != nil || string(b) != "dir\n" {
		t.Fatalf("directory bind through the share: %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "c1/4")); err != nil || !strings.HasPrefix(string(b), "127.0.0.1") {
		t.Fatalf("file bind through the share: %q, %v", b, err)
	}
	// A read-write bind writes to the host; a read-only one refuses.
	if err := os.WriteFile(filepath.Join(root, "c1/3/written"), []byte("x"), 0o644); err != nil {
		t.Fatalf("write through a read-write bind: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.hostDir, "written")); err != nil {
		t.Fatalf("the write did not reach the host: %v", err)
	}
	for _, p := range []string{"c1/4", "c1/5/in-dir"} {
		if err := os.WriteFile(filepath.Join(root, p), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
			t.Errorf("write %s through a read-only bind: %v, want EROFS", p, err)
		}
	}
	// Nothing can be made in the share itself, beside the binds.
	if err := os.WriteFile(filepath.Join(root, "planted"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into the share's root: %v, want EROFS", err)
	}
	if err := os.Mkdir(filepath.Join(root, "c1", "new"), 0o755); !errors.Is(err, unix.EROFS) {
		t.Errorf("mkdir in a container's directory of the share: %v, want EROFS", err)
	}
	if err := f.d.Remove("c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "c1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("container's binds still in the share after Remove: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(f.hostDir, "in-dir")); err != nil || string(b) != "dir\n" {
		t.Fatalf("Remove touched the host's directory: %q, %v", b, err)
	}
}

// A bind made after a daemon entered its own mount namespace (virtiofsd's
// sandbox makes its mounts slaves) reaches it.
func TestShareBindReachesRunningDaemon(t *testing.T) {
	f := newFixture(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs util-linux's unshare")
	}
	gate := filepath.Join(t.TempDir(), "go")
	want := filepath.Join(f.d.Root(), "c2", "0", "in-dir")
	script := `while [ ! -e "$1" ]; do sleep 0.02; done; cat "$2"`
	cmd := exec.Command("unshare", "--mount", "--propagation", "slave", "sh", "-c", script, "sh", gate, want)
	out := new(strings.Builder)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := f.d.Add("c2", []oci.Bind{{Index: 0, Source: f.hostDir, Destination: "/data"}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil || out.String() != "dir\n" {
		t.Fatalf("the other mount namespace read %q (%v): the bind did not propagate", out, err)
	}
}

func TestShareRefuses(t *testing.T) {
	f := newFixture(t)
	sock := filepath.Join(t.TempDir(), "s.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		bind    oci.Bind
		is      func(error) bool
		mention string
	}{
		{"missing", oci.Bind{Index: 0, Source: "/nonexistent/cocoon", Destination: "/x"}, errdefs.IsNotFound, "does not exist"},
		{"socket", oci.Bind{Index: 0, Source: sock, Destination: "/run/docker.sock"}, errdefs.IsNotImplemented, "socket"},
		{"device", oci.Bind{Index: 0, Source: "/dev/null", Destination: "/dev/x"}, errdefs.IsNotImplemented, "character device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The first bind is fine and must be undone with the failure.
			err := f.d.Add("bad", []oci.Bind{{Index: 9, Source: f.hostDir, Destination: "/ok"}, tc.bind})
			if err == nil || !tc.is(err) || !strings.Contains(err.Error(), tc.mention) || !strings.Contains(err.Error(), tc.bind.Destination) {
				t.Fatalf("Add: %v", err)
			}
			if left, _ := MountsUnder(filepath.Join(f.state, mountsDirName, "bad")); len(left) > 0 {
				t.Fatalf("a failed Add left mounts: %v", left)
			}
			if _, err := os.Stat(filepath.Join(f.state, mountsDirName, "bad")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a failed Add left its directory: %v", err)
			}
		})
	}
}

// RemoveAll never removes what is in a mounted filesystem.
func TestRemoveAllKeepsMountedFiles(t *testing.T) {
	f := newFixture(t)
	if err := f.d.Add("c1", []oci.Bind{{Index: 0, Source: f.hostDir, Destination: "/data"}}); err != nil {
		t.Fatal(err)
	}
	if err := RemoveAll(f.state); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(f.hostDir, "in-dir")); err != nil {
		t.Fatalf("RemoveAll of the state went into a bind: %v", err)
	}
	if _, err := os.Stat(f.state); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state left: %v", err)
	}
	if err := RemoveAll(f.state); err != nil {
		t.Fatalf("RemoveAll of nothing: %v", err)
	}
}

// A read-only rbind is read-only itself, and a mount under its source
// keeps its own flags, as runc makes "ro" (not recursive).
func TestShareReadOnlyIsNotRecursive(t *testing.T) {
	f := newFixture(t)
	sub := filepath.Join(f.hostDir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	if err := f.d.Add("c1", []oci.Bind{{Index: 0, Source: f.hostDir, Destination: "/ro", ReadOnly: true, Recursive: true}}); err != nil {
		t.Fatal(err)
	}
	root := f.d.Root()
	if err := os.WriteFile(filepath.Join(root, "c1/0/top"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write to the read-only bind: %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(root, "c1/0/sub/file"), []byte("x"), 0o644); err != nil {
		t.Errorf("write to the read-write mount under it: %v", err)
	}
	if err := f.d.Remove("c1"); err != nil {
		t.Fatal(err)
	}
}
