//go:build linux

package execuser

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// lock serialises the provisionings of the process: a provisioning holds
// it while it has sent into it.
var lock = make(chan struct{}, 1)

// now is the clock that dates the shadow entries.
var now = time.Now

// Provision makes sure u exists in the root filesystem at root, a
// directory path as the caller sees it, and reports what it did.
//
// When no well-formed passwd line has u's uid, Provision appends u's
// entry to /etc/passwd (making /etc and the file if missing), a locked
// password line for it to /etc/shadow if that file exists, and makes u's
// home directory, mode 0700 and owned by u, if it does not exist. When
// the uid already has an entry, under u's name or another, the entry is
// left as it is, with no shadow line or home directory added, and the
// Report notes it. Either way a group with u's gid is appended to
// /etc/group unless one exists, and Options.Sudo decides the sudoers
// drop-in. Existing entries, homes and files are never changed except by
// appending; the name of u or of its group being taken by another id is
// an error wrapping ErrConflict, returned before anything is written.
//
// With Options.Sudo, if the image has sudo (an executable regular file at
// /usr/bin/sudo, /bin/sudo or /usr/sbin/sudo), Provision writes
// SudoersDropIn, 0440 root:root, granting the user (the existing entry's
// name when the uid had one) every command as anyone without a password,
// and reads it back to check it as visudo -c would. /etc/sudoers must
// include /etc/sudoers.d, or Provision fails before writing any entry and
// removes a drop-in an earlier provisioning wrote. Without Options.Sudo
// it removes that drop-in.
//
// Every path is resolved inside root, and the files are replaced
// atomically, keeping their owner and mode; one that is a symlink or not
// a regular file is not touched, and the error wraps ErrUnsafe.
// Provisionings in the process are serialised, so that concurrent calls
// for one user append each line once; ctx bounds the wait for another
// provisioning and is checked between the steps.
//
// After the writes Provision looks the user up afresh, by name and by
// uid, as a process in the container would (see LookupName), and puts
// what it found in the Report: a created entry must be found exactly as
// u both ways, and an existing one by uid, or Provision fails. On an
// error the Report says what was done before it.
func Provision(ctx context.Context, root string, u User, o Options) (Report, error) {
	if err := u.Validate(); err != nil {
		return Report{}, err
	}
	if err := ctx.Err(); err != nil {
		return Report{}, fmt.Errorf("exec user %s: %w", u, err)
	}
	select {
	case lock <- struct{}{}:
	case <-ctx.Done():
		return Report{}, fmt.Errorf("exec user %s: waiting for another provisioning: %w", u, ctx.Err())
	}
	defer func() { <-lock }()
	p := &provisioner{ctx: ctx, u: u, o: o, etc: -1}
	if err := p.run(root); err != nil {
		return p.rep, fmt.Errorf("exec user %s in %s: %w", u, root, err)
	}
	return p.rep, p.verify(root)
}

// provisioner is one provisioning.
type provisioner struct {
	ctx context.Context
	u   User
	o   Options
	r   *rootFS
	// etc is a descriptor of /etc as resolved in the root, -1 until it
	// exists.
	etc int
	// existing is the passwd entry u's uid already had, if any.
	existing *Entry
	rep      Report
}

// note adds a note to the report.
func (p *provisioner) note(format string, args ...any) {
	p.rep.Notes = append(p.rep.Notes, fmt.Sprintf(format, args...))
}

// run does the writes of the provisioning.
func (p *provisioner) run(root string) error {
	r, err := openRoot(root)
	if err != nil {
		return err
	}
	defer r.close()
	p.r = r
	if p.etc, err = r.openDir("/etc"); err != nil {
		return err
	}
	defer func() {
		if p.etc >= 0 {
			unix.Close(p.etc)
		}
	}()
	var passwd, groups, shadow file
	if p.etc >= 0 {
		if passwd, err = readChild(p.etc, "passwd", "/etc/passwd"); err != nil {
			return err
		}
		if groups, err = readChild(p.etc, "group", "/etc/group"); err != nil {
			return err
		}
		if shadow, err = readChild(p.etc, "shadow", "/etc/shadow"); err != nil {
			return err
		}
	}

	// Everything that can refuse is decided before anything is written.
	u := p.u
	p.existing = findPasswd(passwd.data, func(e Entry) bool { return e.UID == u.UID })
	if p.existing == nil {
		if e := findPasswd(passwd.data, func(e Entry) bool { return e.Name == u.Name }); e != nil {
			return fmt.Errorf("/etc/passwd: %s is uid %d, not %d: %w", e.Name, e.UID, u.UID, ErrConflict)
		}
	}
	gr := findGroup(groups.data, func(g group) bool { return g.gid == u.GID })
	if gr == nil {
		if g := findGroup(groups.data, func(g group) bool { return g.name == u.Name }); g != nil {
			return fmt.Errorf("/etc/group: group %s is gid %d, not %d: %w", g.name, g.gid, u.GID, ErrConflict)
		}
	}
	hasSudo := false
	if p.o.Sudo {
		if hasSudo, err = p.sudoReady(); err != nil {
			return err
		}
	}

	steps := []func() error{
		func() error {
			if (p.existing == nil || gr == nil) && p.etc < 0 {
				return p.makeEtc()
			}
			return nil
		},
		func() error { return p.passwd(passwd) },
		func() error { return p.group(groups, gr) },
		func() error { return p.shadow(shadow) },
		p.home,
		func() error { return p.sudo(hasSudo) },
	}
	for _, step := range steps {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// makeEtc makes /etc, 0755 root:root, and opens it.
func (p *provisioner) makeEtc() error {
	if _, err := p.r.mkdirAll("/etc", 0o755, 0, 0); err != nil {
		return err
	}
	fd, err := p.r.openDir("/etc")
	if err != nil {
		return err
	}
	if fd < 0 {
		return fmt.Errorf("/etc: made but not found")
	}
	p.etc = fd
	return nil
}

// appendTo appends line to the file name of /etc, f as read; a file made
// anew is 0644 root:root.
func (p *provisioner) appendTo(name string, f file, line string) error {
	mode, uid, gid := uint32(0o644), 0, 0
	if f.exists {
		mode, uid, gid = f.mode(), int(f.st.Uid), int(f.st.Gid)
	}
	return replaceChild(p.etc, name, "/etc/"+name, appendLine(f.data, line), f, mode, uid, gid)
}

// passwd appends the user's entry to passwd, f as read, unless its uid
// has one.
func (p *provisioner) passwd(f file) error {
	if e := p.existing; e != nil {
		p.rep.Passwd = Existed
		if d := differences(*e, p.u); e.Name != p.u.Name {
			p.note("uid %d already has an entry (%s): left as it is", e.UID, e.Name)
		} else if d != "" {
			p.note("uid %d already has an entry (%s) with %s: left as it is", e.UID, e.Name, d)
		}
		return nil
	}
	if err := p.appendTo("passwd", f, passwdLine(p.u)); err != nil {
		return err
	}
	p.rep.Passwd = Created
	return nil
}

// differences says how e differs from u, besides the name and uid.
func differences(e Entry, u User) string {
	var d []string
	if e.GID != u.GID {
		d = append(d, "gid "+strconv.FormatUint(uint64(e.GID), 10))
	}
	if e.Home != u.Home {
		d = append(d, "home "+strconv.Quote(e.Home))
	}
	if e.Shell != u.Shell {
		d = append(d, "shell "+strconv.Quote(e.Shell))
	}
	return strings.Join(d, ", ")
}

// group appends a group for the user's gid to group, f as read, unless
// the gid has one: existing.
func (p *provisioner) group(f file, existing *group) error {
	if existing != nil {
		p.rep.Group = Existed
		if existing.name != p.u.Name {
			p.note("gid %d already has a group (%s): left as it is", existing.gid, existing.name)
		}
		return nil
	}
	if err := p.appendTo("group", f, groupLine(p.u.Name, p.u.GID)); err != nil {
		return err
	}
	p.rep.Group = Created
	return nil
}

// shadow appends a locked password line for a user whose entry this call
// created to shadow, f as read, if the file exists and has none for it.
func (p *provisioner) shadow(f file) error {
	if e := p.existing; e != nil {
		p.rep.Shadow = Absent
		if f.exists && hasShadow(f.data, e.Name) {
			p.rep.Shadow = Existed
		}
		return nil
	}
	switch {
	case !f.exists:
		p.rep.Shadow = Absent
		p.note("/etc/shadow does not exist: not made")
		return nil
	case hasShadow(f.data, p.u.Name):
		p.rep.Shadow = Existed
		p.note("/etc/shadow already has a line for %s: left as it is", p.u.Name)
		return nil
	}
	day := now().Unix() / (24 * 60 * 60)
	if err := p.appendTo("shadow", f, shadowLine(p.u.Name, day)); err != nil {
		return err
	}
	p.rep.Shadow = Created
	return nil
}

// home makes the home directory of a user whose entry this call created,
// unless it exists; for an existing entry it only looks at its home.
func (p *provisioner) home() error {
	if e := p.existing; e != nil {
		p.rep.Home = Absent
		if e.Home == "" {
			return nil
		}
		ok, _, err := p.r.exists(e.Home)
		if err != nil {
			return fmt.Errorf("home of uid %d: %w", e.UID, err)
		}
		if ok {
			p.rep.Home = Existed
		}
		return nil
	}
	ok, st, err := p.r.exists(p.u.Home)
	if err != nil {
		return fmt.Errorf("home: %w", err)
	}
	if ok {
		p.rep.Home = Existed
		switch {
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			p.note("home %s exists and is not a directory: left as it is", p.u.Home)
		case st.Uid != p.u.UID:
			p.note("home %s already exists, owned by %d:%d: left as it is", p.u.Home, st.Uid, st.Gid)
		}
		return nil
	}
	made, err := p.r.mkdirAll(p.u.Home, 0o700, int(p.u.UID), int(p.u.GID))
	if err != nil {
		return fmt.Errorf("home: %w", err)
	}
	if !made {
		p.rep.Home = Existed
		p.note("home %s is a symlink that leads nowhere: left as it is", p.u.Home)
		return nil
	}
	p.rep.Home = Created
	return nil
}

// verify looks the user up afresh and checks the provisioning took.
func (p *provisioner) verify(root string) error {
	u := p.u
	byName, err := LookupName(root, u.Name)
	if err != nil {
		return fmt.Errorf("exec user %s in %s: looking it up by name afresh: %w", u, root, err)
	}
	byUID, err := LookupUID(root, u.UID)
	if err != nil {
		return fmt.Errorf("exec user %s in %s: looking it up by uid afresh: %w", u, root, err)
	}
	p.rep.ByName, p.rep.ByUID = byName, byUID
	want := Entry{Name: u.Name, UID: u.UID, GID: u.GID, Home: u.Home, Shell: u.Shell}
	if p.rep.Passwd == Created {
		if byName != nil && *byName == want && byUID != nil && *byUID == want {
			return nil
		}
	} else if byUID != nil {
		return nil
	}
	return fmt.Errorf("provisioned %s but a fresh lookup found %s by name and %s by uid in the passwd of %s",
		u, describe(byName), describe(byUID), root)
}

// describe is e in the form of a User, or "none".
func describe(e *Entry) string {
	if e == nil {
		return "none"
	}
	return strconv.Quote(User{Name: e.Name, UID: e.UID, GID: e.GID, Home: e.Home, Shell: e.Shell}.String())
}
