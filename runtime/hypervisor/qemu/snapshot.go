package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu/qmp"
)

// A saved state is QEMU's migration stream written to a file: device state
// and guest RAM, a page at a time. QEMU 7.2 (Debian's) has no file: URI
// and -sandbox on denies exec:, so the host opens the file and hands QEMU
// its descriptor (qmp.SendFile) for an fd: URI. Pages that hold only zeros
// cost a flag in the stream, not a page, so its size follows the memory
// the guest touched rather than its nominal size (docs/snapshots.md has
// the numbers).
const (
	// saveFDName and restoreFDName name the descriptors handed to QEMU.
	saveFDName    = "cocoon-save"
	restoreFDName = "cocoon-restore"
	// saveBandwidth lifts QEMU's migration bandwidth limit (7.2's
	// default is 128 MiB/s: pause + save of an idle 256 MiB guest took
	// 155 ms with it, 57 ms without): the stream goes to a local file
	// of a paused guest, nothing to share a link with. QEMU refuses
	// more than SIZE_MAX; 1 TiB/s is unlimited in practice.
	saveBandwidth = 1 << 40
	// saveDowntimeMs is the downtime QEMU may plan for. The guest is
	// paused already, so the whole of RAM goes in the final pass; a
	// high limit keeps QEMU from iterating first.
	saveDowntimeMs = 60_000
	// migrationCancelWait bounds the wait for a cancelled migration to
	// end once ctx is done.
	migrationCancelWait = 5 * time.Second
	// migrationPoll is how often a migration's status is asked for
	// besides the events.
	migrationPoll = 100 * time.Millisecond
	// eventMigration is QEMU's event for a change of migration status,
	// sent once the "events" capability is on.
	eventMigration = "MIGRATION"
)

var _ hypervisor.Snapshotter = (*VM)(nil)

// Pause stops the guest's vCPUs. QEMU's stop is a no-op on a paused guest.
func (v *VM) Pause(ctx context.Context) error {
	if err := v.qmp.Stop(ctx); err != nil {
		return v.vmError(err, "pause vm")
	}
	return nil
}

// Resume lets the guest run again. After a Save, QEMU first takes the
// disks back (it let go of them for a destination that would take over).
func (v *VM) Resume(ctx context.Context) error {
	if err := v.qmp.Cont(ctx); err != nil {
		return v.vmError(err, "resume vm")
	}
	return nil
}

// Save writes the paused guest's state to w (see hypervisor.Snapshotter)
// and returns the disks attached, read from QEMU. A guest with a share is
// refused with errdefs.ErrNotImplemented; a running guest is refused: a state taken while vCPUs run would not match the disks the
// caller copies. On error, or when ctx ends, the migration is cancelled
// and the guest stays paused; what was written to w is incomplete.
func (v *VM) Save(ctx context.Context, w *os.File) (_ hypervisor.SavedState, retErr error) {
	start := time.Now()
	if v.fs != nil {
		// QEMU 7.2's vhost-user-fs-device is unmigratable: the
		// guest's open files live in virtiofsd, outside the state.
		return hypervisor.SavedState{}, fmt.Errorf("%w: save vm: the sandbox shares host directories with its guest (virtio-fs), and a vm with shared directories cannot be checkpointed", errdefs.ErrNotImplemented)
	}
	st, err := v.qmp.QueryStatus(ctx)
	if err != nil {
		return hypervisor.SavedState{}, v.vmError(err, "save vm")
	}
	// "postmigrate" is a guest saved before and not resumed since.
	if st.Running || (st.Status != "paused" && st.Status != "postmigrate") {
		return hypervisor.SavedState{}, fmt.Errorf("%w: save vm: the guest is %s, not paused", errdefs.ErrFailedPrecondition, st.Status)
	}
	disks, err := v.attachedDisks(ctx)
	if err != nil {
		return hypervisor.SavedState{}, v.vmError(err, "save vm: list disks")
	}
	offset, err := w.Seek(0, io.SeekCurrent)
	if err != nil {
		return hypervisor.SavedState{}, fmt.Errorf("save vm: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	if err := v.prepareMigration(ctx, true); err != nil {
		return hypervisor.SavedState{}, v.vmError(err, "save vm")
	}
	events, unsubscribe := v.qmp.Subscribe(qmp.DefaultEventBuffer)
	defer unsubscribe()
	if err := v.qmp.SendFile(ctx, saveFDName, w); err != nil {
		return hypervisor.SavedState{}, v.vmError(err, "save vm: pass the state file")
	}
	if err := v.qmp.Execute(ctx, "migrate", map[string]any{"uri": "fd:" + saveFDName}, nil); err != nil {
		if refused(err) {
			// QEMU did not take the descriptor: release it.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoWait)
			v.qmp.CloseFile(cctx, saveFDName)
			cancel()
		}
		return hypervisor.SavedState{}, v.vmError(err, "save vm")
	}
	if err := v.waitMigration(ctx, events); err != nil {
		return hypervisor.SavedState{}, v.vmError(err, "save vm")
	}
	if err := v.waitPostMigrate(ctx); err != nil {
		return hypervisor.SavedState{}, v.vmError(err, "save vm")
	}
	end, err := w.Seek(0, io.SeekCurrent)
	if err != nil {
		return hypervisor.SavedState{}, fmt.Errorf("save vm: %w", err)
	}
	saved := hypervisor.SavedState{Disks: disks, Bytes: end - offset}
	v.log.WithFields(log.Fields{"bytes": saved.Bytes, "disks": len(disks), "save_ms": time.Since(start).Milliseconds()}).Info("vm state saved")
	return saved, nil
}

// prepareMigration sets what a save and a restore both need: the
// MIGRATION events Save and the restore wait on and, for a save, no
// bandwidth limit.
func (v *VM) prepareMigration(ctx context.Context, save bool) error {
	caps := []map[string]any{{"capability": "events", "state": true}}
	// RAM in a shared file is the file: the state leaves it out
	// (x-ignore-shared), and a restore takes it from the file. Set on
	// both sides and for every VM, since the capability changes the
	// stream's format; a private mapping (a clone) or anonymous RAM is
	// not "shared", so their saves carry their RAM.
	caps = append(caps, map[string]any{"capability": "x-ignore-shared", "state": true})
	if err := v.qmp.Execute(ctx, "migrate-set-capabilities", map[string]any{"capabilities": caps}, nil); err != nil {
		return err
	}
	if !save {
		return nil
	}
	return v.qmp.Execute(ctx, "migrate-set-parameters", map[string]any{
		"max-bandwidth":  saveBandwidth,
		"downtime-limit": saveDowntimeMs,
	}, nil)
}

// migrationInfo is the part of query-migrate the driver reads.
type migrationInfo struct {
	Status    string `json:"status"`
	ErrorDesc string `json:"error-desc"`
}

// waitMigration waits for the migration (outgoing or incoming) to end and
// fails unless it completed. When ctx ends first, it cancels the migration
// and waits for QEMU to wind it down, so no half-written state is still
// being written when it returns.
func (v *VM) waitMigration(ctx context.Context, events <-chan qmp.Event) error {
	// The migration may have ended before the subscription saw it, or
	// its events been dropped: QEMU's own status settles it.
	check := func(c context.Context) (bool, error) {
		var info migrationInfo
		if err := v.qmp.Execute(c, "query-migrate", nil, &info); err != nil {
			return true, err
		}
		return migrationDone(info)
	}
	if done, err := check(ctx); done {
		return err
	}
	// Events are the prompt path; the poll makes sure a dropped event
	// cannot leave the wait hanging until ctx ends.
	poll := time.NewTicker(migrationPoll)
	defer poll.Stop()
	for {
		select {
		case <-poll.C:
			if done, err := check(ctx); done {
				return err
			}
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("wait for migration: %w", qmp.ErrClosed)
			}
			if ev.Name != eventMigration {
				continue
			}
			var d struct {
				Status string `json:"status"`
			}
			if json.Unmarshal(ev.Data, &d) != nil || !terminalMigration(d.Status) {
				continue
			}
			if done, err := check(ctx); done {
				return err
			}
		case <-v.exited:
			return fmt.Errorf("wait for migration: %w", hypervisor.ErrVMExited)
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), migrationCancelWait)
			defer cancel()
			v.qmp.Execute(cctx, "migrate_cancel", nil, nil)
			for cctx.Err() == nil {
				if done, _ := check(cctx); done {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			return fmt.Errorf("wait for migration: %w", ctx.Err())
		}
	}
}

// waitPostMigrate waits for QEMU to leave the finish-migrate run state:
// it reports the migration completed a moment before, and refuses cont
// ("Migration is not finalized yet") until then.
func (v *VM) waitPostMigrate(ctx context.Context) error {
	for {
		st, err := v.qmp.QueryStatus(ctx)
		if err != nil {
			return err
		}
		if st.Status != "finish-migrate" {
			return nil
		}
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("wait for the saved state to settle: %w", ctx.Err())
		}
	}
}

func terminalMigration(status string) bool {
	switch status {
	case "completed", "failed", "cancelled":
		return true
	}
	return false
}

// migrationDone says whether info is a finished migration, and how it
// finished.
func migrationDone(info migrationInfo) (bool, error) {
	switch info.Status {
	case "completed":
		return true, nil
	case "failed", "cancelled":
		why := info.ErrorDesc
		if why == "" {
			why = "no reason given"
		}
		return true, fmt.Errorf("migration %s: %s", info.Status, why)
	}
	return false, nil
}

// attachedDisks reads from QEMU the disks hot-plugged by AttachDisk:
// their ids, files, read-only flags and SCSI targets, sorted by id.
func (v *VM) attachedDisks(ctx context.Context) ([]hypervisor.Disk, error) {
	targets, err := v.scsiTargets(ctx)
	if err != nil {
		return nil, err
	}
	var nodes []struct {
		NodeName string `json:"node-name"`
		File     string `json:"file"`
		RO       bool   `json:"ro"`
		Drv      string `json:"drv"`
	}
	if err := v.qmp.Execute(ctx, "query-named-block-nodes", map[string]any{"flat": true}, &nodes); err != nil {
		return nil, err
	}
	var disks []hypervisor.Disk
	for dev, target := range targets.byDevice {
		id, ok := strings.CutPrefix(dev, diskDevicePrefix)
		if !ok {
			// Only AttachDisk adds SCSI devices; one the driver
			// does not know could not be recreated.
			return nil, fmt.Errorf("%w: scsi device %s was not attached by the driver", errdefs.ErrFailedPrecondition, dev)
		}
		node := diskNodeName(id)
		d := hypervisor.Disk{ID: id, Addr: hypervisor.DiskAddr{SCSIID: target}}
		found := false
		for _, n := range nodes {
			if n.NodeName == node && n.Drv == "raw" {
				d.Path, d.ReadOnly, found = n.File, n.RO, true
			}
		}
		if !found {
			return nil, fmt.Errorf("%w: disk %s has no block node %s", errdefs.ErrFailedPrecondition, id, node)
		}
		disks = append(disks, d)
	}
	sort.Slice(disks, func(i, j int) bool { return disks[i].ID < disks[j].ID })
	return disks, nil
}

// vmError wraps a QMP failure: a lost connection is the VM gone.
func (v *VM) vmError(err error, what string) error {
	if errors.Is(err, qmp.ErrClosed) && !errors.Is(err, hypervisor.ErrVMExited) {
		return fmt.Errorf("%s: %w: %w", what, hypervisor.ErrVMExited, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
