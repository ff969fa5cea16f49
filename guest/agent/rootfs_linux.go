package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/api"
)

// Layout of a container's directory (Config.ContainerDir/<id>).
const (
	layersDir  = "layers"  // layers/<n>: read-only layer n, lowest is 0
	scratchDir = "scratch" // the writable disk: upper/ and work/
	rootfsDir  = "rootfs"  // the assembled root
)

// Rootfs bounds.
const (
	// maxLayers is overlayfs's own limit on lower layers.
	maxLayers = 500
	// diskPoll is how often sysfs is looked at while a disk is awaited.
	diskPoll = 20 * time.Millisecond
	// diskRescanAfter is when the agent asks the SCSI host to scan for a
	// disk that has not appeared: the hot-plug event may have been lost.
	diskRescanAfter = time.Second
)

// devNodeWait bounds the wait for devtmpfs's node of a disk that sysfs
// lists already.
var devNodeWait = time.Second

// DiskRootfs assembles container root filesystems from the disks the host
// hot-plugged onto the guest's virtio-scsi controller: each read-only
// layer is mounted on its own, the scratch disk holds the overlay's upper
// and work directories, and overlayfs joins them.
type DiskRootfs struct {
	// SysDir is where sysfs is mounted (/sys).
	SysDir string
	// DevDir is where devtmpfs is mounted (/dev).
	DevDir string
	// Timeout bounds the wait for each disk to appear; zero is
	// DefaultDiskTimeout.
	Timeout time.Duration

	// sys performs the mounts; nil is the kernel.
	sys mounter
}

// mounter is the part of the kernel DiskRootfs uses; tests record calls.
type mounter interface {
	mount(source, target, fstype string, flags uintptr, data string) error
	// mountIn is mount with dir as the working directory, so that data
	// may name paths relative to it.
	mountIn(dir, source, target, fstype string, flags uintptr, data string) error
	unmount(target string) error
	syncfs(dir string) error
	mknodBlock(path string, major, minor uint32) error
}

var _ RootfsAssembler = (*DiskRootfs)(nil)

func (d *DiskRootfs) kernel() mounter {
	if d.sys == nil {
		return kernelMounter{}
	}
	return d.sys
}

func (d *DiskRootfs) timeout() time.Duration {
	if d.Timeout <= 0 {
		return DefaultDiskTimeout
	}
	return d.Timeout
}

// mountStep is one mount done, to undo in reverse order.
type mountStep struct {
	target string
	// sync flushes the filesystem before it is unmounted.
	sync bool
}

// Assemble mounts the rootfs r describes under dir. With a scratch disk,
// the Mounted's Changed tells by the ext4 filesystem's count of bytes
// written to its disk (sysfs lifetime_write_kbytes), read after a syncfs
// once the overlay is up and again when asked: the count moves only when
// something reaches the disk, and a syncfs puts everything there.
func (d *DiskRootfs) Assemble(ctx context.Context, dir string, r *api.Rootfs) (_ *Mounted, retErr error) {
	if err := validateRootfs(r); err != nil {
		return nil, err
	}
	sys := d.kernel()
	var done []mountStep
	release := func(ctx context.Context) error {
		return unmountAll(ctx, sys, done)
	}
	defer func() {
		if retErr != nil {
			if err := release(ctx); err != nil {
				log.G(ctx).WithError(err).Warn("undo rootfs mounts")
			}
		}
	}()

	root := filepath.Join(dir, rootfsDir)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	if len(r.Layers) == 1 && r.Scratch == nil {
		dev, _, err := d.device(ctx, dir, r.Layers[0])
		if err != nil {
			return nil, err
		}
		if err := d.mountDisk(ctx, dev, root, r.Layers[0].Fstype, unix.MS_RDONLY); err != nil {
			return nil, fmt.Errorf("mount layer 0 (%s) on %s: %w", dev, root, err)
		}
		done = append(done, mountStep{target: root})
		return &Mounted{Root: root, Release: release}, nil
	}

	names := make([]string, len(r.Layers))
	for i, disk := range r.Layers {
		names[i] = strconv.Itoa(i)
		target := filepath.Join(dir, layersDir, names[i])
		if err := os.MkdirAll(target, 0o755); err != nil {
			return nil, fmt.Errorf("rootfs: %w", err)
		}
		dev, _, err := d.device(ctx, dir, disk)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		if err := d.mountDisk(ctx, dev, target, disk.Fstype, unix.MS_RDONLY); err != nil {
			return nil, fmt.Errorf("mount layer %d (%s, %s): %w", i, dev, disk.Fstype, err)
		}
		done = append(done, mountStep{target: target})
	}
	var upper, work, scratch, scratchName string
	if r.Scratch != nil {
		scratch = filepath.Join(dir, scratchDir)
		if err := os.MkdirAll(scratch, 0o755); err != nil {
			return nil, fmt.Errorf("rootfs: %w", err)
		}
		dev, name, err := d.device(ctx, dir, r.Scratch)
		if err != nil {
			return nil, fmt.Errorf("scratch disk: %w", err)
		}
		scratchName = name
		// noatime: reading the container's files must not count as a
		// change of its writable layer.
		if err := d.mountDisk(ctx, dev, scratch, r.Scratch.Fstype, unix.MS_NOATIME); err != nil {
			return nil, fmt.Errorf("mount scratch disk (%s, %s): %w", dev, r.Scratch.Fstype, err)
		}
		done = append(done, mountStep{target: scratch, sync: true})
		upper, work = filepath.Join(scratch, "upper"), filepath.Join(scratch, "work")
		for _, p := range []string{upper, work} {
			// Present already in a scratch disk that was used before
			// (a restored checkpoint).
			if err := os.MkdirAll(p, 0o755); err != nil {
				return nil, fmt.Errorf("scratch disk: %w", err)
			}
		}
	}
	data, err := overlayData(names, upper, work)
	if err != nil {
		return nil, err
	}
	// The lower layers are named relative to the layers directory: with
	// hundreds of layers absolute paths would not fit in a page.
	if err := sys.mountIn(filepath.Join(dir, layersDir), "overlay", root, "overlay", 0, data); err != nil {
		return nil, fmt.Errorf("mount overlay on %s: %w", root, err)
	}
	done = append(done, mountStep{target: root})
	m := &Mounted{Root: root, Release: release}
	if scratch != "" {
		m.Upper, m.Scratch = upper, scratch
		written := func() (uint64, error) {
			if err := sys.syncfs(scratch); err != nil {
				return 0, fmt.Errorf("sync the scratch disk: %w", err)
			}
			return ext4Written(d.SysDir, scratchName)
		}
		base, err := written()
		if err != nil {
			// Without the count every flush reports a change: the host
			// copies the layer back, which is slower, never wrong.
			log.G(ctx).WithError(err).Warn("no write count for the scratch disk; its layer is always copied back")
		}
		m.Changed = func() (bool, error) {
			now, nerr := written()
			if err != nil || nerr != nil {
				return true, nerr
			}
			return now != base, nil
		}
	}
	return m, nil
}

// ext4Written reads how many KiB the ext4 filesystem on block device name
// has written to it (the count includes what was written since mount).
func ext4Written(sysDir, name string) (uint64, error) {
	p := filepath.Join(sysDir, "fs", "ext4", name, "lifetime_write_kbytes")
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return n, nil
}

func validateRootfs(r *api.Rootfs) error {
	if r == nil || len(r.Layers) == 0 {
		return fmt.Errorf("rootfs has no layers: %w", errdefs.ErrInvalidArgument)
	}
	if len(r.Layers) > maxLayers {
		return fmt.Errorf("rootfs has %d layers, overlayfs takes at most %d: %w", len(r.Layers), maxLayers, errdefs.ErrInvalidArgument)
	}
	for i, l := range r.Layers {
		if l.Fstype != "erofs" && l.Fstype != "ext4" {
			return fmt.Errorf("layer %d: filesystem %q: want erofs or ext4: %w", i, l.Fstype, errdefs.ErrInvalidArgument)
		}
	}
	if s := r.Scratch; s != nil {
		if s.Fstype != "ext4" {
			return fmt.Errorf("scratch disk: filesystem %q: want ext4: %w", s.Fstype, errdefs.ErrInvalidArgument)
		}
		if s.ReadOnly {
			return fmt.Errorf("scratch disk is read-only: %w", errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// overlayData builds overlayfs's mount data. lowers are lowest first;
// overlayfs wants the top-most first. Without upper the overlay is
// read-only and needs at least two lowers.
func overlayData(lowers []string, upper, work string) (string, error) {
	if len(lowers) == 0 {
		return "", fmt.Errorf("overlay without layers: %w", errdefs.ErrInvalidArgument)
	}
	if upper == "" && len(lowers) < 2 {
		return "", fmt.Errorf("read-only overlay needs two layers: %w", errdefs.ErrInvalidArgument)
	}
	top := make([]string, len(lowers))
	for i, l := range lowers {
		if strings.ContainsAny(l, ":,") {
			return "", fmt.Errorf("overlay layer path %q holds ':' or ',': %w", l, errdefs.ErrInvalidArgument)
		}
		top[len(lowers)-1-i] = l
	}
	data := "lowerdir=" + strings.Join(top, ":")
	if upper != "" {
		if strings.ContainsAny(upper+work, ":,") {
			return "", fmt.Errorf("overlay upper or work path holds ':' or ',': %w", errdefs.ErrInvalidArgument)
		}
		data += ",upperdir=" + upper + ",workdir=" + work
	}
	// The kernel copies at most a page of mount data.
	if len(data) >= os.Getpagesize() {
		return "", fmt.Errorf("overlay mount options of %d bytes do not fit in a page: %w", len(data), errdefs.ErrInvalidArgument)
	}
	return data, nil
}

// scsiDevicePath is the sysfs directory of the disk at id:lun on the
// first SCSI host, the guest's virtio-scsi controller.
func scsiDevicePath(sysDir string, disk *api.Disk) string {
	return filepath.Join(sysDir, "bus", "scsi", "devices", fmt.Sprintf("0:0:%d:%d", disk.ScsiId, disk.Lun))
}

// blockName returns the block device name (sdX) of the disk at id:lun,
// or "" while it has not appeared.
func blockName(sysDir string, disk *api.Disk) (string, error) {
	entries, err := os.ReadDir(filepath.Join(scsiDevicePath(sysDir, disk), "block"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	switch len(entries) {
	case 0:
		return "", nil
	case 1:
		return entries[0].Name(), nil
	}
	return "", fmt.Errorf("SCSI disk %d:%d has %d block devices: %w", disk.ScsiId, disk.Lun, len(entries), errdefs.ErrUnknown)
}

// waitBlock waits, at most d.Timeout, for the disk's block device.
func (d *DiskRootfs) waitBlock(ctx context.Context, disk *api.Disk) (string, error) {
	start := time.Now()
	rescanned := false
	tick := time.NewTicker(diskPoll)
	defer tick.Stop()
	for {
		name, err := blockName(d.SysDir, disk)
		if err != nil {
			return "", err
		}
		if name != "" {
			return name, nil
		}
		waited := time.Since(start)
		if waited >= d.timeout() {
			return "", fmt.Errorf("SCSI disk %d:%d did not appear in the guest within %s (%s missing): %w",
				disk.ScsiId, disk.Lun, d.timeout(), scsiDevicePath(d.SysDir, disk), errdefs.ErrUnavailable)
		}
		if !rescanned && waited >= diskRescanAfter {
			rescanned = true
			scan := filepath.Join(d.SysDir, "class", "scsi_host", "host0", "scan")
			if err := os.WriteFile(scan, fmt.Appendf(nil, "0 %d %d", disk.ScsiId, disk.Lun), 0); err != nil {
				log.G(ctx).WithError(err).Debug("scsi rescan")
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for SCSI disk %d:%d: %w", disk.ScsiId, disk.Lun, ctx.Err())
		case <-tick.C:
		}
	}
}

// mountDisk mounts the disk at dev on target. A hot-plugged disk is in
// sysfs and /dev (device_add) a moment before it can be opened (bdev_add,
// later in the kernel's device_add_disk); meanwhile opening it fails with
// ENXIO, which is retried, d.Timeout at most.
func (d *DiskRootfs) mountDisk(ctx context.Context, dev, target, fstype string, flags uintptr) error {
	start := time.Now()
	for {
		err := d.kernel().mount(dev, target, fstype, flags, "")
		if !errors.Is(err, unix.ENXIO) || time.Since(start) >= d.timeout() {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(diskPoll):
		}
	}
}

// device returns a device node for the disk (devtmpfs's, or one made in
// the container's directory when /dev lacks it) and its block device name.
func (d *DiskRootfs) device(ctx context.Context, dir string, disk *api.Disk) (node, name string, err error) {
	name, err = d.waitBlock(ctx, disk)
	if err != nil {
		return "", "", err
	}
	// The disk is in sysfs a moment before devtmpfs has its node (the
	// kernel's device_add makes the node last): wait for it. The node
	// made below is a fallback for a /dev without it, and lives in the
	// container's directory, whose file system (/run) may not allow
	// device nodes to be opened: it must not be what a race falls to.
	node = filepath.Join(d.DevDir, name)
	for waited := time.Duration(0); ; waited += diskPoll / 4 {
		if fi, err := os.Stat(node); err == nil && fi.Mode()&os.ModeDevice != 0 {
			return node, name, nil
		}
		if waited >= devNodeWait {
			break
		}
		select {
		case <-ctx.Done():
			return "", "", fmt.Errorf("waiting for %s: %w", node, ctx.Err())
		case <-time.After(diskPoll / 4):
		}
	}
	devFile := filepath.Join(d.SysDir, "class", "block", name, "dev")
	b, err := os.ReadFile(devFile)
	if err != nil {
		return "", "", fmt.Errorf("disk %s: %w", name, err)
	}
	major, minor, err := parseDevNumber(strings.TrimSpace(string(b)))
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", devFile, err)
	}
	node = filepath.Join(dir, "dev-"+name)
	if err := d.kernel().mknodBlock(node, major, minor); err != nil && !errors.Is(err, os.ErrExist) {
		return "", "", fmt.Errorf("device node for %s: %w", name, err)
	}
	return node, name, nil
}

func parseDevNumber(s string) (uint32, uint32, error) {
	maj, min, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("device number %q: want major:minor: %w", s, errdefs.ErrInvalidArgument)
	}
	major, err1 := strconv.ParseUint(maj, 10, 32)
	minor, err2 := strconv.ParseUint(min, 10, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("device number %q: want major:minor: %w", s, errdefs.ErrInvalidArgument)
	}
	return uint32(major), uint32(minor), nil
}

// unmountAll undoes steps in reverse, going on past failures.
func unmountAll(ctx context.Context, sys mounter, steps []mountStep) error {
	var errs []error
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		if s.sync {
			if err := sys.syncfs(s.target); err != nil {
				log.G(ctx).WithError(err).WithField("mount", s.target).Warn("sync before unmount")
			}
		}
		if err := sys.unmount(s.target); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", s.target, err))
		}
	}
	return errors.Join(errs...)
}

// kernelMounter is mounter on the running kernel.
type kernelMounter struct{}

func (kernelMounter) mount(source, target, fstype string, flags uintptr, data string) error {
	return unix.Mount(source, target, fstype, flags, data)
}

// mountIn mounts from a thread of its own whose working directory is
// dir: the thread unshares its filesystem attributes, so the agent's
// working directory stays as it is, and is never reused (the Go runtime
// ends a locked thread whose goroutine exits).
func (kernelMounter) mountIn(dir, source, target, fstype string, flags uintptr, data string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare fs: %w", err)
			return
		}
		if err := unix.Chdir(dir); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount(source, target, fstype, flags, data)
	}()
	return <-errc
}

// unmount unmounts target; when it is busy (a process of a deleted
// container not yet gone) it is detached, which frees the filesystem once
// the last user is gone.
func (kernelMounter) unmount(target string) error {
	err := unix.Unmount(target, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(target, unix.MNT_DETACH)
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		// Not mounted (any more).
		return nil
	}
	return err
}

func (kernelMounter) syncfs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

func (kernelMounter) mknodBlock(path string, major, minor uint32) error {
	return unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(major, minor)))
}
