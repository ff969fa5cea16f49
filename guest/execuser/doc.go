// Package execuser provisions a user into a container's root filesystem:
// the user named by a container's io.cocoon.exec-user annotation, in the
// form name:uid:gid[:home[:shell]].
//
// The host uses the package to parse and validate the annotation (Parse,
// User.Validate) and to tell whether the container's mounts would hide
// the files a provisioning writes (Covering). The guest agent calls
// Provision on the assembled root filesystem before the OCI runtime runs
// the container: it appends the user's entries to /etc/passwd, /etc/group
// and /etc/shadow, makes the home directory and, optionally, a sudoers
// drop-in, then looks the user up afresh the way a process in the
// container would.
//
// Provision treats the root filesystem as hostile: every path is resolved
// inside it (an absolute or ".." symlink in the image resolves below the
// root, never to the agent's own files), and the files it rewrites are
// replaced atomically and only when they are regular files, never through
// a symlink. Existing entries are left as they are.
//
// Nothing is fsynced: a rename is atomic for every reader in the guest
// without it, and durability past the guest's life buys nothing here. A
// container's writable layer reaches the host only from a running guest
// (its copy back), and a checkpoint freezes, so syncs, the filesystems
// first. Each flush costs a round trip to the host's disk, about 10 ms,
// and a provisioning would take several.
//
// Parse, Validate, String and Covering are portable; Provision and the
// lookups need Linux 5.6 or later (openat2).
package execuser
