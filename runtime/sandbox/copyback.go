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
	if ct.copiedBack {
		return nil
	}
	rep, took, err := s.copyLayer(ctx, ct)
	if errdefs.IsFailedPrecondition(err) {
		return fmt.Errorf("container %s: %w", ct.id, err)
	}
	ct.copiedBack = true
	if err != nil {
		log.G(ctx).WithError(err).WithField("container", ct.id).Error("the container's writes could not be copied back to the host and are lost")
		return nil
	}
	logCopy(ctx, ct, rep, took, "copied back")
	return nil
}

// syncLayer copies a paused container's writable layer to the host, as
// copyBack does, so that what reads the host's snapshot while the
// container is paused (a commit, a checkpoint with --rw) sees its writes.
// It is done at each pause and again at delete; a failure is logged and
// the pause stands.
func (s *Sandbox) syncLayer(ctx context.Context, ct *container) {
	rep, took, err := s.copyLayer(ctx, ct)
	if err != nil {
		log.G(ctx).WithError(err).WithField("container", ct.id).Warn("the paused container's writes were not synced to the host")
		return
	}
	logCopy(ctx, ct, rep, took, "synced to the host")
}

// copyLayer streams ct's writable layer from the guest and applies it to
// the host's upperdir or directory root.
func (s *Sandbox) copyLayer(ctx context.Context, ct *container) (rootfs.CopyBackReport, time.Duration, error) {
	if s.rootfs == nil || ct.rootfs.ReadOnly() || (ct.rootfs.Upper == "" && ct.rootfs.Bind == "") {
		return rootfs.CopyBackReport{}, 0, nil
	}
	began := time.Now()
	rep, err := s.rootfs.CopyBack(ctx, ct.rootfs, ct.policy, func(ctx context.Context, maxBytes int64) (rootfs.LayerDiff, error) {
		return s.agent.ExportLayer(ctx, ct.guest, s.containers.processID(), maxBytes)
	})
	return rep, time.Since(began), err
}

func logCopy(ctx context.Context, ct *container, rep rootfs.CopyBackReport, took time.Duration, done string) {
	logger := log.G(ctx).WithField("container", ct.id).WithField("copy_back_ms", took.Milliseconds())
	if !rep.Changed {
		logger.Debug("writable layer unchanged: nothing to copy back")
		return
	}
	logger.WithField("bytes", rep.Bytes).WithField("entries", rep.Entries).WithField("left_out", rep.Denied()).
		Info("writable layer " + done)
}
