package harness

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// PauseImage is the sandbox image of a CRI instance: the pause of
// ./pause, built static and imported into CRINamespace when the instance
// starts. It bears the name of Kubernetes' own so that the sandbox image
// a test or critest expects is there without a pull.
const PauseImage = "registry.k8s.io/pause:3.10"

// pausePackage is the pause's package in this module.
const pausePackage = "./integration/harness/pause"

// importPause builds the pause into the instance's CRI directory, makes
// an OCI archive of it as PauseImage and imports that into CRINamespace.
func (c *Containerd) importPause() error {
	dir := filepath.Join(c.criDir(), "pause")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, pausePackage)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the pause: %w", &buildError{err: err, out: string(out)})
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "pause", Mode: 0o755, Size: int64(len(data)), ModTime: epoch}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	archive, err := ociArchive(filepath.Join(dir, "pause-oci.tar"), layer.Bytes(), ociImage{ref: PauseImage, cmd: []string{"/pause"}})
	if err != nil {
		return err
	}
	_, err = c.CRICtr("images", "import", archive)
	return err
}

// CRICtr runs ctr with args in CRINamespace (2 minutes at most) and
// returns its stdout, as Ctr does in Namespace.
func (c *Containerd) CRICtr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, stderr bytes.Buffer
	cmd := c.ctrCommandIn(ctx, CRINamespace, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("ctr -n %s %s: %w\n%s", CRINamespace, strings.Join(args, " "), err, stderr.String())
	}
	return out.String(), nil
}

// ImportCRI imports the OCI archive at path (one that BusyboxArchive or
// ociArchive wrote) into CRINamespace, where CRI finds its images, and
// returns the name of its first image, by which a container
// configuration names it.
func ImportCRI(t testing.TB, c *Containerd, archive string) string {
	t.Helper()
	ref, err := archiveRef(archive)
	if err != nil {
		t.Fatalf("image archive %s: %v", archive, err)
	}
	if _, err := c.CRICtr("images", "import", archive); err != nil {
		t.Fatal(err)
	}
	return ref
}

// ImportBusyboxCRI imports the busybox image (see ImportBusybox) into
// CRINamespace and returns its name, BusyboxRef.
func ImportBusyboxCRI(t testing.TB, c *Containerd) string {
	t.Helper()
	archive, err := BusyboxArchive(t.TempDir())
	if err != nil {
		t.Fatalf("build busybox image: %v", err)
	}
	return ImportCRI(t, c, archive)
}

// archiveRef is the name of the first image of an OCI archive: the
// io.containerd.image.name annotation of its index's first manifest.
func archiveRef(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return "", fmt.Errorf("no index.json: %w", err)
		}
		if h.Name != "index.json" {
			continue
		}
		var index struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&index); err != nil {
			return "", fmt.Errorf("index.json: %w", err)
		}
		for _, m := range index.Manifests {
			if ref := m.Annotations["io.containerd.image.name"]; ref != "" {
				return ref, nil
			}
		}
		return "", fmt.Errorf("index.json names no image")
	}
}
