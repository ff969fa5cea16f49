// Package image locates the guest image (kernel, initrd and the manifest
// that records their digests) and verifies it before a guest boots from it.
//
// Hashing tens of MiB on every sandbox start would cost more than the rest
// of the shim, so a successful verification is remembered in a stamp file
// keyed by the manifest digest and each file's identity (device, inode,
// size, mtime, ctime). Any change to a file changes its ctime, so a stamp
// never vouches for content it did not hash.
package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// ManifestName is the manifest's file name inside the image directory.
const ManifestName = "manifest.json"

// maxManifestBytes bounds the manifest read.
const maxManifestBytes = 1 << 20

// Manifest describes a built guest image.
type Manifest struct {
	// Schema is the manifest format version; this package reads 1.
	Schema int `json:"schema"`
	// Kernel is the guest kernel.
	Kernel Kernel `json:"kernel"`
	// Initrd is the initial ramdisk holding the agent and runc.
	Initrd File `json:"initrd"`
	// Components records the versions and digests of what the initrd
	// holds; informational, its shape is the image build's.
	Components map[string]any `json:"components,omitempty"`
}

// File is one file of the image.
type File struct {
	// Path is relative to the image directory.
	Path string `json:"path"`
	// SHA256 is the hex digest of the file.
	SHA256 string `json:"sha256"`
	// Compression of an initrd: none, lz4, ...
	Compression string `json:"compression,omitempty"`
}

// Kernel is the guest kernel file and what was learnt building it.
type Kernel struct {
	File
	// Version is the kernel version (6.1.x).
	Version string `json:"version,omitempty"`
	// Release is what uname -r says in the guest.
	Release string `json:"release,omitempty"`
	// Source names the package the kernel was built from.
	Source string `json:"source,omitempty"`
	// Cmdline is the kernel command line tuned for this kernel; the
	// hypervisor driver adds its own arguments to it.
	Cmdline string `json:"cmdline,omitempty"`
	// HZ is the kernel's CONFIG_HZ.
	HZ int `json:"hz,omitempty"`
}

// Image is a guest image on disk.
type Image struct {
	// Dir is the image directory.
	Dir string
	// Manifest as read from Dir.
	Manifest Manifest
	// manifestDigest is the sha256 of the manifest file.
	manifestDigest string
}

// KernelPath is the absolute path of the kernel.
func (i *Image) KernelPath() string { return filepath.Join(i.Dir, i.Manifest.Kernel.Path) }

// InitrdPath is the absolute path of the initrd.
func (i *Image) InitrdPath() string { return filepath.Join(i.Dir, i.Manifest.Initrd.Path) }

// KernelArgs splits the manifest's tuned command line.
func (i *Image) KernelArgs() []string { return strings.Fields(i.Manifest.Kernel.Cmdline) }

// Open reads and checks the manifest in dir. It does not hash the files;
// Verify does.
func Open(dir string) (*Image, error) {
	p := filepath.Join(dir, ManifestName)
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("guest image: %s missing (run `make guest install` or set guest.image_dir): %w", p, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("guest image: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("guest image: read %s: %w", p, err)
	}
	if len(data) > maxManifestBytes {
		return nil, fmt.Errorf("guest image: %s is over %d bytes: %w", p, maxManifestBytes, errdefs.ErrInvalidArgument)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("guest image: %s: %w: %v", p, errdefs.ErrInvalidArgument, err)
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("guest image: %s: %w: %v", p, errdefs.ErrInvalidArgument, err)
	}
	sum := sha256.Sum256(data)
	return &Image{Dir: dir, Manifest: m, manifestDigest: hex.EncodeToString(sum[:])}, nil
}

func (m Manifest) validate() error {
	if m.Schema != 1 {
		return fmt.Errorf("schema %d: this build reads schema 1", m.Schema)
	}
	for _, f := range []File{m.Kernel.File, m.Initrd} {
		if f.Path == "" || filepath.IsAbs(f.Path) || strings.Contains(f.Path, "..") {
			return fmt.Errorf("file path %q: must be a plain relative path", f.Path)
		}
		if len(f.SHA256) != 64 {
			return fmt.Errorf("%s: sha256 %q is not a hex sha256", f.Path, f.SHA256)
		}
		if _, err := hex.DecodeString(f.SHA256); err != nil {
			return fmt.Errorf("%s: sha256 %q is not a hex sha256", f.Path, f.SHA256)
		}
	}
	return nil
}

// ErrDigestMismatch is wrapped by Verify when a file's content differs
// from the manifest.
var ErrDigestMismatch = errors.New("digest mismatch")

// Verify checks the kernel and initrd against the manifest. When stampDir
// is not empty, a successful check is remembered there and later calls for
// unchanged files return at once; a stamp that cannot be written is not an
// error (the check still happened).
func (i *Image) Verify(stampDir string) error {
	ids, err := i.fileIDs()
	if err != nil {
		return err
	}
	key := i.manifestDigest + "\n" + ids
	stamp := ""
	if stampDir != "" {
		stamp = filepath.Join(stampDir, "image-verified-"+i.manifestDigest[:16])
		if b, err := os.ReadFile(stamp); err == nil && string(b) == key {
			return nil
		}
	}
	for _, f := range []File{i.Manifest.Kernel.File, i.Manifest.Initrd} {
		got, err := fileSHA256(filepath.Join(i.Dir, f.Path))
		if err != nil {
			return fmt.Errorf("guest image: %w", err)
		}
		if got != f.SHA256 {
			return fmt.Errorf("guest image: %s: %w: manifest says %s, file has %s (rebuild with `make guest install`)",
				filepath.Join(i.Dir, f.Path), ErrDigestMismatch, f.SHA256, got)
		}
	}
	if stamp != "" {
		writeStamp(stamp, key)
	}
	return nil
}

// fileIDs describes the identity of the image files as stat sees it.
func (i *Image) fileIDs() (string, error) {
	var b strings.Builder
	for _, f := range []File{i.Manifest.Kernel.File, i.Manifest.Initrd} {
		p := filepath.Join(i.Dir, f.Path)
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return "", fmt.Errorf("guest image: %s: %w", p, err)
		}
		fmt.Fprintf(&b, "%s %d %d %d %d.%d %d.%d\n", f.Path, st.Dev, st.Ino, st.Size,
			st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	}
	return b.String(), nil
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeStamp writes atomically so a concurrent reader never sees half a key.
func writeStamp(p, key string) {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".stamp-*")
	if err != nil {
		return
	}
	_, werr := tmp.WriteString(key)
	cerr := tmp.Close()
	if werr != nil || cerr != nil || os.Rename(tmp.Name(), p) != nil {
		os.Remove(tmp.Name())
	}
}
