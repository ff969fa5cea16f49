package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu/qmp"
)

// Disks are hot-plugged as scsi-hd devices on the virtio-scsi controller
// every guest gets at boot (SCSIControllerID), one per SCSI target, LUN 0.
// Linux names such a disk /sys/bus/scsi/devices/0:0:<target>:0: host 0 (the
// guest's only SCSI host), channel 0.
//
// Which targets are taken is asked of QEMU, not remembered here: QEMU is
// the one authority (it refuses a target already in use), the answer holds
// for a VM whatever process attached its disks, and it survives a restore
// into a new QEMU. Concurrent attaches that pick the same target are
// settled by QEMU: the loser sees the target taken and tries the next.
const (
	// maxSCSITarget is the highest target QEMU's virtio-scsi accepts.
	maxSCSITarget = 255
	// diskDevicePrefix starts the QEMU device id of every disk, which
	// must begin with a letter whatever the caller's id.
	diskDevicePrefix = "disk-"
	// maxDiskIDLen bounds a caller's disk id.
	maxDiskIDLen = 128
	// maxAttachTries bounds how often AttachDisk moves to another target
	// after losing one to a concurrent attach.
	maxAttachTries = 8
	// detachWait bounds the wait for QEMU's DEVICE_DELETED when ctx has
	// no deadline.
	detachWait = 30 * time.Second
	// undoWait bounds the clean-up of a failed attach.
	undoWait = 5 * time.Second
	// eventDeviceDeleted is QEMU's event for an unplugged device.
	eventDeviceDeleted = "DEVICE_DELETED"
)

var _ hypervisor.DiskAttacher = (*VM)(nil)

// AttachDisk hot-plugs the file at path as a SCSI disk named id and
// returns its address once QEMU has added it; the guest sees it shortly
// after, as /sys/bus/scsi/devices/0:0:<SCSIID>:0.
//
// The file is opened with the host page cache (cache.direct off), so the
// sandboxes that share a layer image share its pages, and with thread-pool
// I/O. A read-only disk is read-only to the guest too (write-protected);
// a writable one passes the guest's discards on as holes in the file.
//
// The target is chosen starting from a hash of id, so that a disk attached
// right after another was detached seldom lands on the target the guest
// may still be tearing down. An id already attached fails with
// errdefs.ErrAlreadyExists, a bad id or path with errdefs.ErrInvalidArgument
// or errdefs.ErrNotFound, a full controller with
// errdefs.ErrResourceExhausted. On error nothing is left attached.
func (v *VM) AttachDisk(ctx context.Context, id, path string, readOnly bool) (_ hypervisor.DiskAddr, retErr error) {
	if err := validateDiskID(id); err != nil {
		return hypervisor.DiskAddr{}, err
	}
	if err := checkDiskFile(path); err != nil {
		return hypervisor.DiskAddr{}, err
	}
	dev, node := diskDeviceID(id), diskNodeName(id)
	lg := v.log.WithFields(log.Fields{"disk": id, "path": path, "read_only": readOnly})
	start := time.Now()

	taken, err := v.scsiTargets(ctx)
	if err != nil {
		return hypervisor.DiskAddr{}, v.diskError(err, "attach disk %s", id)
	}
	if _, ok := taken.byDevice[dev]; ok {
		return hypervisor.DiskAddr{}, fmt.Errorf("%w: disk %s is already attached", errdefs.ErrAlreadyExists, id)
	}

	// Undo what this call added, and what it may have added: QEMU may
	// carry out a command whose reply ctx did not wait for. What QEMU
	// refused was not added (it may be another caller's disk).
	var undoDev, undoNode string
	defer func() {
		if retErr != nil && (undoDev != "" || undoNode != "") {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoWait)
			defer cancel()
			if _, err := v.removeDisk(uctx, undoDev, undoNode); err != nil {
				lg.WithError(err).Warn("undo failed disk attach")
			}
		}
	}()
	err = v.qmp.Execute(ctx, "blockdev-add", blockdevArgs(node, path, readOnly), nil)
	if err == nil || !refused(err) {
		undoNode = node
	}
	if err != nil {
		return hypervisor.DiskAddr{}, v.diskError(err, "attach disk %s: open %s", id, path)
	}
	// Targets are looked up before trying one, rather than tried
	// blindly: a query costs ~0.5 ms per SCSI device, a device_add that
	// QEMU refuses 40-60 ms.
	for try := 1; ; try++ {
		target, free := taken.free(targetHint(id))
		if !free {
			return hypervisor.DiskAddr{}, fmt.Errorf("%w: attach disk %s: all %d SCSI targets are in use", errdefs.ErrResourceExhausted, id, maxSCSITarget+1)
		}
		err := v.qmp.Execute(ctx, "device_add", scsiDiskArgs(id, target), nil)
		if err == nil {
			lg.WithFields(log.Fields{"scsi_id": target, "attach_ms": time.Since(start).Milliseconds()}).Info("disk attached")
			return hypervisor.DiskAddr{SCSIID: target, LUN: 0}, nil
		}
		if !refused(err) {
			undoDev = dev
		}
		if !refused(err) || try == maxAttachTries {
			return hypervisor.DiskAddr{}, v.diskError(err, "attach disk %s", id)
		}
		// Did a concurrent attach take the target? Then try another;
		// otherwise QEMU refused for a reason of its own.
		now, qerr := v.scsiTargets(ctx)
		if qerr != nil {
			return hypervisor.DiskAddr{}, v.diskError(err, "attach disk %s", id)
		}
		if holder, ok := now.byTarget[target]; !ok || holder == dev {
			return hypervisor.DiskAddr{}, v.diskError(err, "attach disk %s at scsi target %d", id, target)
		}
		taken = now
	}
}

// DetachDisk unplugs the disk named id and closes its file. QEMU unplugs a
// SCSI disk at once and tells the guest afterwards, so the guest must have
// stopped using it (unmounted) first, or its I/O fails. Detaching a disk
// that is not attached fails with errdefs.ErrNotFound.
func (v *VM) DetachDisk(ctx context.Context, id string) error {
	if err := validateDiskID(id); err != nil {
		return err
	}
	found, err := v.removeDisk(ctx, diskDeviceID(id), diskNodeName(id))
	if err != nil {
		return v.diskError(err, "detach disk %s", id)
	}
	if !found {
		return fmt.Errorf("%w: disk %s is not attached", errdefs.ErrNotFound, id)
	}
	v.log.WithField("disk", id).Info("disk detached")
	return nil
}

// removeDisk unplugs device dev, waiting for QEMU to report it gone, then
// deletes block node node; each only if given and present. It reports
// whether either was present.
func (v *VM) removeDisk(ctx context.Context, dev, node string) (found bool, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, detachWait)
		defer cancel()
	}
	if dev != "" {
		// Subscribe first: QEMU may send the event before its reply.
		events, unsubscribe := v.qmp.Subscribe(qmp.DefaultEventBuffer)
		defer unsubscribe()
		err = v.qmp.Execute(ctx, "device_del", map[string]any{"id": dev}, nil)
		var qe *qmp.Error
		switch {
		case errors.As(err, &qe) && qe.Class == "DeviceNotFound":
		case err != nil:
			return false, err
		default:
			found = true
			if err := waitDeviceDeleted(ctx, events, dev); err != nil {
				return true, err
			}
		}
	}
	if node == "" {
		return found, nil
	}
	nodes, err := v.blockNodes(ctx)
	if err != nil {
		return found, err
	}
	if !nodes[node] {
		return found, nil
	}
	if err := v.qmp.Execute(ctx, "blockdev-del", map[string]any{"node-name": node}, nil); err != nil {
		return true, err
	}
	return true, nil
}

// waitDeviceDeleted waits for QEMU's DEVICE_DELETED event for dev.
func waitDeviceDeleted(ctx context.Context, events <-chan qmp.Event, dev string) error {
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("wait for %s to be unplugged: %w", dev, qmp.ErrClosed)
			}
			if ev.Name != eventDeviceDeleted {
				continue
			}
			var d struct {
				Device string `json:"device"`
			}
			if json.Unmarshal(ev.Data, &d) == nil && d.Device == dev {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("wait for %s to be unplugged: %w", dev, ctx.Err())
		}
	}
}

// scsiTargets is which targets of the controller hold a device.
type scsiTargets struct {
	// byTarget maps a target to the id of the device holding it.
	byTarget map[uint32]string
	// byDevice maps a device id to its target.
	byDevice map[string]uint32
}

// free returns the first target not taken, from hint upwards, wrapping.
func (t scsiTargets) free(hint uint32) (uint32, bool) {
	for i := uint32(0); i <= maxSCSITarget; i++ {
		target := (hint + i) % (maxSCSITarget + 1)
		if _, ok := t.byTarget[target]; !ok {
			return target, true
		}
	}
	return 0, false
}

// scsiTargets asks QEMU for the SCSI devices and their targets. The
// controller is the guest's only SCSI bus, so every SCSI device is on it.
// Devices are looked for where QEMU keeps those added on the command line
// or with device_add: with an id (named by it) and without one (named by
// QOM path).
func (v *VM) scsiTargets(ctx context.Context) (scsiTargets, error) {
	t := scsiTargets{byTarget: map[uint32]string{}, byDevice: map[string]uint32{}}
	for _, parent := range []string{"/machine/peripheral", "/machine/peripheral-anon"} {
		var children []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		}
		if err := v.qmp.Execute(ctx, "qom-list", map[string]any{"path": parent}, &children); err != nil {
			return t, err
		}
		for _, c := range children {
			if !strings.HasPrefix(c.Type, "child<scsi-") {
				continue
			}
			path := parent + "/" + c.Name
			var target uint32
			if err := v.qmp.Execute(ctx, "qom-get", map[string]any{"path": path, "property": "scsi-id"}, &target); err != nil {
				return t, err
			}
			name := c.Name
			if parent != "/machine/peripheral" {
				name = path
			}
			t.byTarget[target] = name
			t.byDevice[name] = target
		}
	}
	return t, nil
}

// blockNodes returns the names of QEMU's block nodes.
func (v *VM) blockNodes(ctx context.Context) (map[string]bool, error) {
	var nodes []struct {
		NodeName string `json:"node-name"`
	}
	if err := v.qmp.Execute(ctx, "query-named-block-nodes", map[string]any{"flat": true}, &nodes); err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		out[n.NodeName] = true
	}
	return out, nil
}

// blockdevArgs are the blockdev-add arguments of a disk: a raw image on a
// file, through the host page cache (shared by every sandbox using the
// same layer), with thread-pool I/O. QEMU's file driver locks the file:
// shared for a read-only disk, exclusive for a writable one, so a scratch
// disk cannot be attached to two VMs.
func blockdevArgs(node, path string, readOnly bool) map[string]any {
	args := map[string]any{
		"driver":    "raw",
		"node-name": node,
		"read-only": readOnly,
		"cache":     map[string]any{"direct": false, "no-flush": false},
		"file": map[string]any{
			"driver":   "file",
			"filename": path,
			"aio":      "threads",
		},
	}
	if !readOnly {
		args["discard"] = "unmap"
	}
	return args
}

// diskDeviceID is the QEMU device id of disk id.
func diskDeviceID(id string) string { return diskDevicePrefix + id }

// diskNodeName is the QEMU block node name of disk id. Node names are
// limited to 31 characters, so it is derived from a hash.
func diskNodeName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return diskDevicePrefix + hex.EncodeToString(sum[:])[:26]
}

// targetHint is where the search for a free target starts for disk id.
func targetHint(id string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(id))
	return h.Sum32() % (maxSCSITarget + 1)
}

// validateDiskID accepts ids QEMU takes in a device id: letters, digits,
// '-', '.', '_'.
func validateDiskID(id string) error {
	if id == "" || len(id) > maxDiskIDLen {
		return fmt.Errorf("%w: disk id %q must be 1 to %d characters", errdefs.ErrInvalidArgument, id, maxDiskIDLen)
	}
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
		default:
			return fmt.Errorf("%w: disk id %q holds %q; use letters, digits, '-', '.' and '_'", errdefs.ErrInvalidArgument, id, r)
		}
	}
	return nil
}

// checkDiskFile fails early, naming the path, where QEMU would fail with a
// less direct message.
func checkDiskFile(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%w: disk image %q is not an absolute path", errdefs.ErrInvalidArgument, path)
	}
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: disk image %s does not exist", errdefs.ErrNotFound, path)
	}
	if err != nil {
		return fmt.Errorf("%w: disk image: %w", errdefs.ErrInvalidArgument, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() == 0 {
		return fmt.Errorf("%w: disk image %s is not a non-empty regular file", errdefs.ErrInvalidArgument, path)
	}
	return nil
}

// refused reports whether QEMU answered a command with an error, which
// means it did not carry it out, as opposed to a reply that never came.
func refused(err error) bool {
	var qe *qmp.Error
	return errors.As(err, &qe)
}

// diskError wraps a QMP failure, mapping what means something to errdefs:
// a lost connection is the VM gone, an unknown device a disk not found.
func (v *VM) diskError(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	var qe *qmp.Error
	switch {
	case errors.Is(err, qmp.ErrClosed):
		return fmt.Errorf("%s: %w: %w", msg, hypervisor.ErrVMExited, err)
	case errors.As(err, &qe) && qe.Class == "DeviceNotFound":
		return fmt.Errorf("%s: %w: %w", msg, errdefs.ErrNotFound, err)
	default:
		return fmt.Errorf("%s: %w", msg, err)
	}
}
