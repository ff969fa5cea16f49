//go:build linux

package agent

import (
	"context"
	"fmt"
	"path"
	"strconv"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/api"
)

// sandboxShm is the sandbox's /dev/shm: a tmpfs of the guest's that
// every container which binds it shares, as a pod's containers share
// the pod's /dev/shm (api.ShmDir). It is mounted the first time a
// container's spec binds it and stays for the guest's life: the pod's
// sandbox container holds it for as long as the pod lives.
type sandboxShm struct {
	dir  string
	size int64
	once onceMount
}

func newSandboxShm(cfg Config) *sandboxShm {
	return &sandboxShm{dir: cfg.ShmDir, size: api.ShmSizeBytes}
}

// prepare mounts the shm if spec binds it.
func (d *sandboxShm) prepare(ctx context.Context, id string, spec *bundleSpec) error {
	binds, err := spec.bindMounts()
	if err != nil {
		return fmt.Errorf("container %s: mounts: %w: %v", id, errdefs.ErrInvalidArgument, err)
	}
	for _, b := range binds {
		if path.Clean(b.Source) == d.dir {
			if err := d.mount(ctx); err != nil {
				return fmt.Errorf("container %s: %w", id, err)
			}
			return nil
		}
	}
	return nil
}

// mount mounts the tmpfs on dir once: world-writable and sticky, as
// /dev/shm is, without devices, set-id programs or executables.
func (d *sandboxShm) mount(ctx context.Context) error {
	return d.once.do(ctx, d.dir, "the sandbox's shm", func(dir string) error {
		data := "mode=1777,size=" + strconv.FormatInt(d.size, 10)
		if err := unix.Mount("shm", dir, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, data); err != nil {
			return fmt.Errorf("mount the sandbox's shm on %s: %w", dir, err)
		}
		return nil
	})
}
