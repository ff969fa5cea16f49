// Package rootfs turns the mounts containerd hands a shim (overlayfs
// lowerdirs and upperdir, or a bind mount) into block devices for the
// guest: each read-only layer becomes an EROFS image, built once and kept
// in a cache keyed so that a changed layer is never served stale, and the
// writable layer lives on a sparse ext4 scratch disk of the container's
// own. The agent assembles the overlay in the guest. Block devices, not a
// shared filesystem, so that a VM snapshot captures the whole container.
//
// Cache is the entry point: Prepare turns a container's mounts into a
// Rootfs, Release gives it back, GC removes the layer images nobody needs.
// docs/rootfs.md explains the cache key, the locking and the limits.
package rootfs

// Mount is one mount as containerd describes it (containerd's
// mount.Mount, without importing containerd here).
type Mount struct {
	// Type is the mount type: "overlay" or "bind".
	Type string
	// Source is the mount source.
	Source string
	// Options are the mount options (lowerdir=..., upperdir=..., ro...).
	Options []string
}

// Rootfs is what a container's root filesystem becomes.
type Rootfs struct {
	// Layers are EROFS image files, lowest layer first. They belong to the
	// cache: never written, shared between containers.
	Layers []string
	// Scratch is the container's own sparse ext4 image holding the
	// writable layer; empty for a read-only root.
	Scratch string
	// Dir is the container directory given to Prepare. It holds Scratch,
	// and the cache keeps Layers for as long as it exists or until
	// Release.
	Dir string
	// Upper is the host's overlay upperdir Scratch was seeded from, where
	// CopyBack puts the container's writes; empty when there is none.
	Upper string
	// Bind is the writable directory a bind root came from (ctr run
	// --rootfs), onto which CopyBack applies the container's writes;
	// empty for other roots.
	Bind string
	// Lowers are the host directories Layers were built from, lowest
	// first: what CopyBack's policy looks up to tell a copy-up from a
	// write.
	Lowers []string
}

// ReadOnly reports whether the root has no writable layer.
func (r Rootfs) ReadOnly() bool { return r.Scratch == "" }

// Layout of a scratch disk, which the agent relies on to assemble the
// overlay: the writable layer's upperdir and workdir are these two
// directories at the root of the ext4 filesystem.
const (
	// ScratchUpperDir is the overlay upperdir on the scratch disk. Its
	// own mode, owner and xattrs are those of the container's root
	// directory, as overlayfs takes them from the upperdir.
	ScratchUpperDir = "upper"
	// ScratchWorkDir is the overlay workdir on the scratch disk.
	ScratchWorkDir = "work"
	// ScratchFile is the scratch image's name in the container directory.
	ScratchFile = "scratch.ext4"
)

// Filesystem types of the disks, as the guest mounts them.
const (
	LayerFSType   = "erofs"
	ScratchFSType = "ext4"
)
