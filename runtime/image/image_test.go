package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// makeImage writes a kernel, an initrd and a matching manifest.
func makeImage(t *testing.T) (string, Manifest) {
	t.Helper()
	dir := t.TempDir()
	k, i := []byte("kernel bytes"), []byte("initrd bytes")
	os.WriteFile(filepath.Join(dir, "vmlinux"), k, 0o644)
	os.WriteFile(filepath.Join(dir, "initrd.img"), i, 0o644)
	m := Manifest{Schema: 1,
		Kernel: Kernel{File: File{Path: "vmlinux", SHA256: digest(k)}, Version: "6.1.0", Cmdline: "quiet  panic=-1"},
		Initrd: File{Path: "initrd.img", SHA256: digest(i), Compression: "none"}}
	writeManifest(t, dir, m)
	return dir, m
}

func writeManifest(t *testing.T, dir string, m Manifest) {
	t.Helper()
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, ManifestName), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOpenAndVerify(t *testing.T) {
	dir, _ := makeImage(t)
	img, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if img.KernelPath() != filepath.Join(dir, "vmlinux") || strings.Join(img.KernelArgs(), ",") != "quiet,panic=-1" {
		t.Fatalf("paths/args: %s %v", img.KernelPath(), img.KernelArgs())
	}
	stamps := t.TempDir()
	if err := img.Verify(stamps); err != nil {
		t.Fatal(err)
	}
	// Change the initrd, same size: the stamp must not vouch for it.
	time.Sleep(10 * time.Millisecond)
	os.WriteFile(filepath.Join(dir, "initrd.img"), []byte("INITRD bytes"), 0o644)
	if err := img.Verify(stamps); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("verify after change: %v, want digest mismatch", err)
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open(t.TempDir()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing manifest: %v", err)
	}
	cases := map[string]func(*Manifest){
		"schema":       func(m *Manifest) { m.Schema = 2 },
		"absolute":     func(m *Manifest) { m.Kernel.Path = "/etc/passwd" },
		"escape":       func(m *Manifest) { m.Initrd.Path = "../x" },
		"short digest": func(m *Manifest) { m.Kernel.SHA256 = "abc" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			dir, m := makeImage(t)
			mutate(&m)
			writeManifest(t, dir, m)
			if _, err := Open(dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("err = %v, want invalid argument", err)
			}
		})
	}
	dir, _ := makeImage(t)
	os.WriteFile(filepath.Join(dir, ManifestName), []byte("{not json"), 0o644)
	if _, err := Open(dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("garbage manifest: %v", err)
	}
}
