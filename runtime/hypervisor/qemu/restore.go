package qemu

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

// restore brings a saved state into a QEMU started with -S -incoming
// defer: the disks first, where the guest had them (the stream holds the
// controller's state, which names its targets, but not the devices
// themselves), then the state through its descriptor; the guest is paused
// once it is in, and resumed if asked. Launch kills QEMU if it fails.
func (v *VM) restore(ctx context.Context, r *hypervisor.Restore) error {
	start := time.Now()
	if r.Check != nil {
		if err := r.Check(v.machine); err != nil {
			return err
		}
	}
	for _, d := range r.Disks {
		if err := v.qmp.Execute(ctx, "blockdev-add", blockdevArgs(diskNodeName(d.ID), d.Path, d.ReadOnly), nil); err != nil {
			return v.diskError(err, "restore vm: disk %s: open %s", d.ID, d.Path)
		}
		if err := v.qmp.Execute(ctx, "device_add", scsiDiskArgs(d.ID, d.Addr.SCSIID), nil); err != nil {
			return v.diskError(err, "restore vm: disk %s at scsi target %d", d.ID, d.Addr.SCSIID)
		}
	}
	if err := v.prepareMigration(ctx, false); err != nil {
		return v.vmError(err, "restore vm")
	}
	events, unsubscribe := v.qmp.Subscribe(0)
	defer unsubscribe()
	if err := v.qmp.SendFile(ctx, restoreFDName, r.State); err != nil {
		return v.vmError(err, "restore vm: pass the state file")
	}
	if err := v.qmp.Execute(ctx, "migrate-incoming", map[string]any{"uri": "fd:" + restoreFDName}, nil); err != nil {
		return v.vmError(err, "restore vm")
	}
	if err := v.waitMigration(ctx, events); err != nil {
		// QEMU exits when a state does not load; its stderr says why
		// ("Not a migration stream", a device that does not match).
		select {
		case <-v.exited:
			err = v.ExitError()
		case <-time.After(ioDrainWait):
		}
		// A stream QEMU cannot load is a bad or foreign state file,
		// not a broken VMM.
		return fmt.Errorf("%w: restore vm: load saved state: %w", errdefs.ErrInvalidArgument, err)
	}
	loaded := time.Since(start)
	if r.Resume {
		if err := v.Resume(ctx); err != nil {
			return fmt.Errorf("restore vm: %w", err)
		}
	}
	v.log.WithFields(log.Fields{"disks": len(r.Disks), "load_ms": loaded.Milliseconds(), "resumed": r.Resume}).Info("vm state restored")
	return nil
}

// scsiDiskArgs are the device_add arguments of disk id at target.
func scsiDiskArgs(id string, target uint32) map[string]any {
	return map[string]any{
		"driver":  "scsi-hd",
		"id":      diskDeviceID(id),
		"bus":     SCSIControllerID + ".0",
		"channel": 0,
		"scsi-id": target,
		"lun":     0,
		"drive":   diskNodeName(id),
	}
}

// validateRestore checks a Restore before anything starts.
func validateRestore(r *hypervisor.Restore) error {
	if r.State == nil {
		return fmt.Errorf("%w: restore without a state file", errdefs.ErrInvalidArgument)
	}
	ids := map[string]bool{}
	targets := map[uint32]string{}
	for _, d := range r.Disks {
		if err := validateDiskID(d.ID); err != nil {
			return err
		}
		if ids[d.ID] {
			return fmt.Errorf("%w: restore lists disk %s twice", errdefs.ErrInvalidArgument, d.ID)
		}
		ids[d.ID] = true
		if d.Addr.SCSIID > maxSCSITarget || d.Addr.LUN != 0 {
			return fmt.Errorf("%w: disk %s at %d:%d: the driver uses targets 0-%d, LUN 0", errdefs.ErrInvalidArgument, d.ID, d.Addr.SCSIID, d.Addr.LUN, maxSCSITarget)
		}
		if other, ok := targets[d.Addr.SCSIID]; ok {
			return fmt.Errorf("%w: disks %s and %s share scsi target %d", errdefs.ErrInvalidArgument, other, d.ID, d.Addr.SCSIID)
		}
		targets[d.Addr.SCSIID] = d.ID
		if err := checkDiskFile(d.Path); err != nil {
			return err
		}
	}
	return nil
}
