package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/hostcgroup"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu"
	"github.com/cocoonrt/cocoon/runtime/share"
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
	removePodCgroup(ctx, bundle, st.Address)
	if err := share.UnmountAll(filepath.Join(bundle, "rootfs")); err != nil {
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
	if err := share.RemoveAll(st.SandboxDir); err != nil {
		return fmt.Errorf("remove the state of sandbox %s: %w", st.SandboxID, err)
	}
	removeSocket(st.Address)
	return nil
}

// removePodCgroup removes the host cgroup that the shim of a pod's
// sandbox container joined (hostcgroup.Join), once that shim is gone:
// it leaves it itself when it stops the VM, but not when it dies. It
// kills nothing; a cgroup that still holds a process is left, logged.
func removePodCgroup(ctx context.Context, bundle, address string) {
	spec, err := oci.ReadBundleSpec(bundle)
	if err != nil {
		log.G(ctx).WithError(err).Debug("no spec in the bundle: no pod cgroup to remove")
		return
	}
	path := oci.PodCgroupsPath(spec)
	if path == "" || (address != "" && canConnect(address)) {
		return
	}
	if err := hostcgroup.Remove(path); err != nil {
		log.G(ctx).WithError(err).Warn("remove the pod's cgroup")
	}
}
