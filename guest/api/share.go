package api

// The directory a sandbox shares with its guest through virtio-fs. The
// host exports one directory per sandbox under ShareTag, and writes each
// bind mount of a container's spec as a bind mount whose source is under
// ShareRoot; the agent mounts the share at ShareRoot the first time a
// container needs it.
const (
	// ShareTag is the virtio-fs tag of the shared directory: what the
	// guest names in mount -t virtiofs <tag>.
	ShareTag = "cocoon-shared"
	// ShareRoot is where the guest mounts the shared directory, the
	// root of every bind mount source the host translated.
	ShareRoot = "/run/cocoon/shared"
)

// ShmDir is the guest's /dev/shm for a sandbox's containers: a tmpfs the
// agent mounts the first time a container binds it, shared by every
// container of the sandbox, as a pod's containers share the pod's
// /dev/shm. The host writes a container's bind mount of its own /dev/shm
// (CRI's sandbox shm, Docker's) as a bind of ShmDir.
const ShmDir = "/run/cocoon/shm"

// ShmSizeBytes is the size of ShmDir: 64 MiB, CRI's and Docker's default.
const ShmSizeBytes = 64 << 20
