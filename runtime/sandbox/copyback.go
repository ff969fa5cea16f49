package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/rootfs"
)

// copyBack takes ct's writable layer back into the host's upperdir (or
// directory root), as runc's containers write there directly: the guest
// exports the layer as a layer diff on a stream of the agent session and
// the cache applies it through the container's policy (rootfs.CopyBack).
// It runs while the VM runs, the container stopped (or never started),
// before the guest unmounts the layer: from DeleteContainer, or from
// FlushContainer for a VM stopped next.
//
// A container's layer is copied back once. Only an error of the
// container's state (not stopped, busy) is returned, for the caller to
// fail with; any other failure (a diff over the bound, too slow, not
// whole, a full disk, a guest that died) is logged at error level, as the
// container's writes are then lost, and is not tried again: it must not
// keep the container from being deleted, which it never could be.
func (s *Sandbox) copyBack(ctx context.Context, ct *container) error {
	if ct.copiedBack || s.rootfs == nil || ct.rootfs.ReadOnly() || (ct.rootfs.Upper == "" && ct.rootfs.Bind == "") {
		return nil
	}
	began := time.Now()
	rep, err := s.rootfs.CopyBack(ctx, ct.rootfs, ct.policy, func(ctx context.Context, maxBytes int64) (rootfs.LayerDiff, error) {
		return s.agent.ExportLayer(ctx, ct.id, s.containers.processID(), maxBytes)
	})
	took := time.Since(began)
	if errdefs.IsFailedPrecondition(err) {
		return fmt.Errorf("container %s: %w", ct.id, err)
	}
	ct.copiedBack = true
	logger := log.G(ctx).WithField("container", ct.id).WithField("copy_back_ms", took.Milliseconds())
	switch {
	case err != nil:
		logger.WithError(err).Error("the container's writes could not be copied back to the host and are lost")
	case rep.Changed:
		logger.WithField("bytes", rep.Bytes).WithField("entries", rep.Entries).WithField("left_out", rep.Denied()).
			Info("writable layer copied back")
	default:
		logger.Debug("writable layer unchanged: nothing to copy back")
	}
	return nil
}
