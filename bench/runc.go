package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// busybox is Debian's busybox-static, the whole rootfs of the runc
// baseline container.
const busybox = "/bin/busybox"

// benchRunc times `runc run` of /bin/true in a busybox bundle, n times:
// what the same command costs without a VM.
func benchRunc(ctx context.Context, n int) ([]float64, error) {
	runc, err := exec.LookPath("runc")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cocoon-bench-runc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := makeBundle(ctx, dir); err != nil {
		return nil, err
	}
	var out []float64
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("cocoon-bench-%d-%d", os.Getpid(), i)
		start := time.Now()
		cmd := exec.CommandContext(ctx, runc, "run", "--bundle", dir, id)
		if b, err := cmd.CombinedOutput(); err != nil {
			exec.Command(runc, "delete", "-f", id).Run()
			return nil, fmt.Errorf("runc run: %v: %s", err, b)
		}
		out = append(out, ms(time.Since(start)))
	}
	return out, nil
}

func makeBundle(ctx context.Context, dir string) error {
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return err
		}
	}
	if err := exec.CommandContext(ctx, "cp", busybox, filepath.Join(rootfs, "bin", "busybox")).Run(); err != nil {
		return fmt.Errorf("copy %s (Debian busybox-static): %w", busybox, err)
	}
	if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", "true")); err != nil {
		return err
	}
	spec, err := exec.CommandContext(ctx, "runc", "spec", "--bundle", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runc spec: %v: %s", err, spec)
	}
	p := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		return err
	}
	proc := cfg["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/bin/true"}
	data, err = json.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(p, data, 0o644)
}
