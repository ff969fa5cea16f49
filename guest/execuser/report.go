package execuser

import "errors"

// SudoersDropIn is the path, inside the root filesystem, of the sudoers
// drop-in Provision writes.
const SudoersDropIn = "/etc/sudoers.d/cocoon-exec-user"

// ErrConflict is returned, wrapped, when the user's name is taken by
// another uid in passwd, or the group's name by another gid in group.
// Retrying cannot help.
var ErrConflict = errors.New("name taken by another id")

// ErrUnsafe is returned, wrapped, when a file Provision would rewrite or
// remove is a symlink or not a regular file, or when a path cannot be
// resolved inside the root filesystem. Retrying cannot help.
var ErrUnsafe = errors.New("unsafe to rewrite")

// Options are what Provision does besides the passwd, group and shadow
// entries and the home directory.
type Options struct {
	// Sudo writes a sudoers drop-in granting the user NOPASSWD: ALL
	// when the image has sudo; false removes the drop-in an earlier
	// provisioning wrote, if any.
	Sudo bool
}

// Status says what Provision did with one item.
type Status string

// The statuses of a Report's items.
const (
	Created Status = "created" // written by this call
	Existed Status = "existed" // already there (the sudo drop-in: as it would be written); left as it was
	Absent  Status = "absent"  // not there and not made: /etc/shadow, or an existing entry's shadow line or home
	Written Status = "written" // sudo drop-in written or rewritten
	Removed Status = "removed" // sudo drop-in removed (Sudo false)
	NoSudo  Status = "no-sudo" // Sudo asked but the image has no sudo binary: nothing written
	Off     Status = "off"     // Sudo false and no drop-in to remove
)

// Entry is a passwd entry as a lookup found it.
type Entry struct {
	Name     string
	UID, GID uint32
	Home     string
	Shell    string
}

// Report is what Provision did and what a fresh lookup found afterwards.
type Report struct {
	// Passwd, Group and Shadow are what became of the user's entry in
	// /etc/passwd, /etc/group and /etc/shadow; Home of its home
	// directory; Sudo of SudoersDropIn.
	Passwd, Group, Shadow, Home, Sudo Status
	// ByName and ByUID are the passwd entries a fresh lookup of the
	// user's name and of its uid found after the writes (nil: none).
	ByName, ByUID *Entry
	// Notes say what was left as it was and why, as in
	// "uid 4242 already has an entry (alice): left as it is".
	Notes []string
}
