//go:build linux

package execuser

// passwdPath is the passwd file, inside the root filesystem.
const passwdPath = "/etc/passwd"

// LookupName returns the entry for the user named name in the passwd
// file of the root filesystem at root, as a fresh process in the
// container would find it with the nss "files" source: /etc/passwd
// resolved inside root (symlinks in it followed, never out of it), the
// first well-formed line with that name winning; leading blanks are
// skipped, and comments and lines starting with '+' or '-' are not
// entries. It returns nil and no error when there is no such entry or no
// passwd file.
func LookupName(root, name string) (*Entry, error) {
	return lookup(root, func(e Entry) bool { return e.Name == name })
}

// LookupUID is like LookupName but looks the user up by uid.
func LookupUID(root string, uid uint32) (*Entry, error) {
	return lookup(root, func(e Entry) bool { return e.UID == uid })
}

// lookup returns the first well-formed entry of root's passwd that
// match accepts.
func lookup(root string, match func(Entry) bool) (*Entry, error) {
	r, err := openRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.close()
	f, err := r.readResolved(passwdPath)
	if err != nil {
		return nil, err
	}
	return findPasswd(f.data, match), nil
}
