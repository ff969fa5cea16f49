package harness

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// BusyboxRef is the name ImportBusybox gives the image.
const BusyboxRef = "docker.io/cocoon/busybox:test"

// busyboxPath is Debian's busybox-static, a static binary that runs in
// any rootfs.
const busyboxPath = "/bin/busybox"

// ImportBusybox builds a one-layer OCI image of the host's static busybox
// (/bin/busybox with a symlink per applet in /bin) and imports it into c
// as BusyboxRef. No registry is involved.
func ImportBusybox(t testing.TB, c *Containerd) string {
	t.Helper()
	archive, err := BusyboxArchive(t.TempDir())
	if err != nil {
		t.Fatalf("build busybox image: %v", err)
	}
	c.MustCtr("images", "import", archive)
	return BusyboxRef
}

// Import builds the busybox image (see ImportBusybox) in a temporary
// directory and imports it into c as BusyboxRef: ImportBusybox for
// programs that are not tests.
func Import(c *Containerd) (string, error) {
	dir, err := os.MkdirTemp("", "cocoon-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	archive, err := BusyboxArchive(dir)
	if err != nil {
		return "", fmt.Errorf("build busybox image: %w", err)
	}
	if _, err := c.Ctr("images", "import", archive); err != nil {
		return "", err
	}
	return BusyboxRef, nil
}

// BusyboxArchive writes the busybox image as an OCI image layout tarball
// in dir and returns its path.
func BusyboxArchive(dir string) (string, error) {
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		return "", fmt.Errorf("%w (install busybox-static)", err)
	}
	applets, err := exec.Command(busyboxPath, "--list").Output()
	if err != nil {
		return "", fmt.Errorf("busybox --list: %w", err)
	}
	layer, err := busyboxLayer(bb, strings.Fields(string(applets)))
	if err != nil {
		return "", err
	}
	return ociArchive(filepath.Join(dir, "busybox-oci.tar"), layer, ociImage{ref: BusyboxRef, cmd: []string{"/bin/sh"}})
}

// ociImage is an image of an OCI archive: its name, what it runs and as
// whom ("" for root).
type ociImage struct {
	ref  string
	cmd  []string
	user string
}

// ociArchive writes an OCI image layout tarball at out: the images, each
// of the one uncompressed layer.
func ociArchive(out string, layer []byte, images ...ociImage) (string, error) {
	layerDesc := descriptor("application/vnd.oci.image.layer.v1.tar", layer)
	blobs := [][]byte{layer}
	var manifests []any
	for _, img := range images {
		cfg := map[string]any{
			"Env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Cmd": img.cmd,
		}
		if img.user != "" {
			cfg["User"] = img.user
		}
		config, _ := json.Marshal(map[string]any{
			"architecture": "amd64",
			"os":           "linux",
			"config":       cfg,
			"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDesc["digest"].(string)}},
		})
		configDesc := descriptor("application/vnd.oci.image.config.v1+json", config)
		manifest, _ := json.Marshal(map[string]any{
			"schemaVersion": 2,
			"mediaType":     "application/vnd.oci.image.manifest.v1+json",
			"config":        configDesc,
			"layers":        []any{layerDesc},
		})
		manifestDesc := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
		manifestDesc["platform"] = map[string]string{"architecture": "amd64", "os": "linux"}
		manifestDesc["annotations"] = map[string]string{
			"io.containerd.image.name":          img.ref,
			"org.opencontainers.image.ref.name": "test",
		}
		manifests = append(manifests, manifestDesc)
		blobs = append(blobs, config, manifest)
	}
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     manifests,
	})

	files := map[string][]byte{
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json": index,
	}
	for _, blob := range blobs {
		files["blobs/sha256/"+hexDigest(blob)] = blob
	}
	var buf bytes.Buffer
	if err := writeTar(&buf, files, nil); err != nil {
		return "", err
	}
	return out, os.WriteFile(out, buf.Bytes(), 0o644)
}

// DebianRef is the name ImportDebian gives the image, and DebianUserRef
// the same image with "User": "4242" in its config: its containers' init
// runs as that uid, which Debian's /etc/passwd does not have.
const (
	DebianRef     = "docker.io/cocoon/debian-sudo:test"
	DebianUserRef = "docker.io/cocoon/debian-sudo:uid4242"
)

// debianRoot is the Debian root with sudo that `make test-deps` makes
// (integration/debian-image.sh).
const debianRoot = "/opt/cocoon-test/images/debian-sudo.tar"

// ImportDebian imports a one-layer OCI image of a small Debian 12 root
// that has sudo (debianRoot) into c as DebianRef and DebianUserRef, and
// returns DebianRef. Its /etc/passwd is Debian's own: no user of uid 1000
// or above.
func ImportDebian(t testing.TB, c *Containerd) string {
	t.Helper()
	layer, err := os.ReadFile(debianRoot)
	if err != nil {
		t.Fatalf("the Debian test image: %v (make test-deps makes it)", err)
	}
	archive, err := ociArchive(filepath.Join(t.TempDir(), "debian-oci.tar"), layer,
		ociImage{ref: DebianRef, cmd: []string{"/bin/bash"}},
		ociImage{ref: DebianUserRef, cmd: []string{"/bin/bash"}, user: "4242"})
	if err != nil {
		t.Fatalf("build the Debian image: %v", err)
	}
	c.MustCtr("images", "import", archive)
	return DebianRef
}

// busyboxLayer is the image's only layer.
func busyboxLayer(bb []byte, applets []string) ([]byte, error) {
	links := map[string]string{}
	for _, a := range applets {
		if a != "busybox" && !strings.Contains(a, "/") {
			links["bin/"+a] = "busybox"
		}
	}
	var buf bytes.Buffer
	files := map[string][]byte{"bin/busybox": bb}
	dirs := []string{"bin", "dev", "etc", "proc", "sys", "tmp", "root", "var"}
	tw := tar.NewWriter(&buf)
	for _, d := range dirs {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := writeEntries(tw, files, links); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// epoch is every entry's mtime: the image is the same on every build.
var epoch = time.Unix(0, 0)

func writeTar(buf *bytes.Buffer, files map[string][]byte, links map[string]string) error {
	tw := tar.NewWriter(buf)
	if err := writeEntries(tw, files, links); err != nil {
		return err
	}
	return tw.Close()
}

// writeEntries writes files (mode 0755 for the busybox binary, 0644 else)
// and symlinks, sorted by name.
func writeEntries(tw *tar.Writer, files map[string][]byte, links map[string]string) error {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		mode := int64(0o644)
		if n == "bin/busybox" {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: mode, Size: int64(len(files[n])), ModTime: epoch}); err != nil {
			return err
		}
		if _, err := tw.Write(files[n]); err != nil {
			return err
		}
	}
	lnames := make([]string, 0, len(links))
	for n := range links {
		lnames = append(lnames, n)
	}
	sort.Strings(lnames)
	for _, n := range lnames {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: n, Linkname: links[n], Mode: 0o777, ModTime: epoch}); err != nil {
			return err
		}
	}
	return nil
}

func hexDigest(b []byte) string { return fmt.Sprintf("%x", sha256.Sum256(b)) }

func descriptor(mediaType string, blob []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": "sha256:" + hexDigest(blob), "size": len(blob)}
}
