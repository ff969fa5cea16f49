package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu"
)

// killedStatus is the exit status delete reports: the container's
// processes died with their VM, as if SIGKILLed.
const killedStatus = 128 + uint32(unix.SIGKILL)

// deleteAction answers `<shim> ... -id <id> -bundle <dir> delete`, which
// containerd runs when a shim went away (crashed, was killed, or just
// exited: containerd 1.6 runs it after every shim). If the sandbox's shim
// is gone, its VM and state are cleaned up from what start saved in the
// bundle; a shim that still runs (serving the rest of a pod) is left
// alone. It prints a protobuf DeleteResponse (identical in task v2 and v3).
func deleteAction(ctx context.Context, f flags, env Env) error {
	bundle, err := bundleDir(f)
	if err != nil {
		return err
	}
	ctx, closeLog := actionLog(ctx, bundle, f.debug)
	defer closeLog()
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("id", f.id))
	st, err := readBundleState(bundle)
	switch {
	case err == nil:
		if err := cleanupSandbox(ctx, st); err != nil {
			return err
		}
	case errors.Is(err, os.ErrNotExist):
		log.G(ctx).Debug("no shim state in the bundle: nothing to clean up")
	default:
		return err
	}
	if err := unmountAll(filepath.Join(bundle, "rootfs")); err != nil {
		log.G(ctx).WithError(err).Warn("unmount the bundle's rootfs")
	}
	data, err := proto.Marshal(&taskapi.DeleteResponse{ExitStatus: killedStatus, ExitedAt: timestamppb.Now()})
	if err != nil {
		return err
	}
	_, err = env.Stdout.Write(data)
	return err
}

// cleanupSandbox stops the VM of a sandbox whose shim is gone, unmounts
// what may be mounted in its state directory and removes it.
func cleanupSandbox(ctx context.Context, st bundleState) error {
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", st.SandboxID))
	if canConnect(st.Address) {
		log.G(ctx).Debug("the sandbox's shim still runs: it cleans up itself")
		return nil
	}
	if _, err := os.Stat(st.SandboxDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	log.G(ctx).WithField("state_dir", st.SandboxDir).Info("cleaning up after a dead shim")
	if err := qemu.Cleanup(ctx, st.SandboxDir); err != nil {
		return fmt.Errorf("stop the VM of sandbox %s: %w", st.SandboxID, err)
	}
	if err := unmountAll(st.SandboxDir); err != nil {
		return fmt.Errorf("sandbox %s: %w", st.SandboxID, err)
	}
	if err := os.RemoveAll(st.SandboxDir); err != nil {
		return fmt.Errorf("remove the state of sandbox %s: %w", st.SandboxID, err)
	}
	removeSocket(st.Address)
	return nil
}

// unmountAll detaches every mount at or below dir, deepest first.
func unmountAll(dir string) error {
	points, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Clean(dir)))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}
