package harness

// The CRI harness for programs that are not tests (the bench): a Crictl
// without a test, the configuration files runp and create take, and the
// busybox image in CRINamespace. The methods of a Crictl that take a
// testing.TB, and MustRun, are for tests; a program uses Run or Command.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// OpenCrictl returns a Crictl bound to c, which Start started WithCRI,
// with its files in dir: NewCrictl for programs that are not tests. It
// wraps ErrCRIToolsNotInstalled when crictl is not installed. The caller
// removes its pods before it stops c.
func OpenCrictl(c *Containerd, dir string) (*Crictl, error) {
	if c.cri == nil {
		return nil, errors.New("OpenCrictl: containerd was started without WithCRI")
	}
	tools, err := CRIToolsDir()
	if err != nil {
		return nil, err
	}
	return newCrictl(c, filepath.Join(tools, "crictl"), dir)
}

// newCrictl is a Crictl of bin bound to c, writing its crictl.yaml into
// dir.
func newCrictl(c *Containerd, bin, dir string) (*Crictl, error) {
	x := &Crictl{Bin: bin, Dir: dir, Timeout: 2 * time.Minute, c: c}
	x.Config = filepath.Join(x.Dir, "crictl.yaml")
	yaml := fmt.Sprintf("runtime-endpoint: %s\nimage-endpoint: %s\ntimeout: %d\ndebug: false\npull-image-on-create: false\n",
		c.CRIEndpoint(), c.CRIEndpoint(), int(x.Timeout.Seconds()))
	if err := os.WriteFile(x.Config, []byte(yaml), 0o644); err != nil {
		return nil, err
	}
	return x, nil
}

// WriteConfig writes config (a PodConfig, a ContainerConfig, or anything
// that marshals to the CRI's type) as JSON into Dir and returns its
// path, which runp and create take; kind names the file.
func (x *Crictl) WriteConfig(kind string, config any) (string, error) {
	data, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return "", fmt.Errorf("%s config: %w", kind, err)
	}
	path := filepath.Join(x.Dir, fmt.Sprintf("%s-%d.json", kind, x.next()))
	return path, os.WriteFile(path, data, 0o644)
}

// ImportCRIBusybox imports the busybox image (see ImportBusybox) into
// CRINamespace and returns its name, BusyboxRef: ImportBusyboxCRI for
// programs that are not tests.
func ImportCRIBusybox(c *Containerd) (string, error) {
	dir, err := os.MkdirTemp("", "cocoon-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	archive, err := BusyboxArchive(dir)
	if err != nil {
		return "", fmt.Errorf("build busybox image: %w", err)
	}
	ref, err := archiveRef(archive)
	if err != nil {
		return "", fmt.Errorf("image archive %s: %w", archive, err)
	}
	if _, err := c.CRICtr("images", "import", archive); err != nil {
		return "", err
	}
	return ref, nil
}
