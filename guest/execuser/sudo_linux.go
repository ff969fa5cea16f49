//go:build linux

package execuser

import (
	"bytes"
	"errors"
	"fmt"
	"path"

	"golang.org/x/sys/unix"
)

// sudoBinaries are where an image with sudo has it.
var sudoBinaries = []string{"/usr/bin/sudo", "/bin/sudo", "/usr/sbin/sudo"}

// dropInName is the name of SudoersDropIn in /etc/sudoers.d.
var dropInName = path.Base(SudoersDropIn)

// hasSudo reports whether the image has sudo: an executable regular file
// at one of sudoBinaries, resolved in the root.
func (p *provisioner) hasSudo() bool {
	for _, b := range sudoBinaries {
		fd, err := p.r.open(b, unix.O_PATH)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0 {
			return true
		}
	}
	return false
}

// sudoReady reports whether the image has sudo, and returns an error when
// it has but /etc/sudoers does not include /etc/sudoers.d, where a
// drop-in would go unread; the drop-in an earlier provisioning wrote is
// removed then.
func (p *provisioner) sudoReady() (bool, error) {
	if !p.hasSudo() {
		return false, nil
	}
	f, err := p.r.readResolved("/etc/sudoers")
	if err != nil {
		return false, err
	}
	if f.exists && includesDropIns(f.data) {
		return true, nil
	}
	problem := "/etc/sudoers does not include " + sudoersDir
	if !f.exists {
		problem = "/etc/sudoers does not exist, so it does not include " + sudoersDir
	}
	if _, err := p.removeDropIn(); err != nil {
		return false, fmt.Errorf("%s; removing %s: %w", problem, SudoersDropIn, err)
	}
	return false, errors.New(problem)
}

// removeDropIn removes SudoersDropIn and reports whether it was there.
func (p *provisioner) removeDropIn() (bool, error) {
	dfd, err := p.r.openDir(sudoersDir)
	if err != nil || dfd < 0 {
		return false, err
	}
	defer unix.Close(dfd)
	return removeChild(dfd, dropInName, SudoersDropIn)
}

// sudo writes or removes SudoersDropIn as Options.Sudo says; hasSudo is
// sudoReady's answer.
func (p *provisioner) sudo(hasSudo bool) error {
	if !p.o.Sudo {
		removed, err := p.removeDropIn()
		if err != nil {
			return err
		}
		p.rep.Sudo = Off
		if removed {
			p.rep.Sudo = Removed
		}
		return nil
	}
	if !hasSudo {
		p.rep.Sudo = NoSudo
		return nil
	}
	name := p.u.Name
	if p.existing != nil {
		name = p.existing.Name
	}
	user := sudoersUser(name, p.u.UID)
	if user != name {
		p.note("sudo would not read the name %q as a user: %s names uid %d", name, SudoersDropIn, p.u.UID)
	}
	content := dropInContent(user)

	if _, err := p.r.mkdirAll(sudoersDir, 0o755, 0, 0); err != nil {
		return err
	}
	dfd, err := p.r.openDir(sudoersDir)
	if err != nil {
		return err
	}
	if dfd < 0 {
		return fmt.Errorf("%s: made but not found", sudoersDir)
	}
	defer unix.Close(dfd)
	prev, err := readChild(dfd, dropInName, SudoersDropIn)
	if err != nil {
		return err
	}
	status := Written
	if isDropIn(prev, content) {
		status = Existed
	} else if err := replaceChild(dfd, dropInName, SudoersDropIn, content, prev, 0o440, 0, 0); err != nil {
		return err
	}
	back, err := readChild(dfd, dropInName, SudoersDropIn)
	if err == nil {
		err = checkWritten(back, content)
	}
	if err != nil {
		if _, rerr := removeChild(dfd, dropInName, SudoersDropIn); rerr != nil {
			return fmt.Errorf("%s: %w (and removing it: %v)", SudoersDropIn, err, rerr)
		}
		return fmt.Errorf("%s: %w; removed it", SudoersDropIn, err)
	}
	p.rep.Sudo = status
	return nil
}

// isDropIn reports whether f is the drop-in holding content, 0440
// root:root.
func isDropIn(f file, content []byte) bool {
	return f.exists && bytes.Equal(f.data, content) && f.mode() == 0o440 && f.st.Uid == 0 && f.st.Gid == 0
}

// checkWritten checks the drop-in f, read back after writing content, the
// way visudo -c would.
func checkWritten(f file, content []byte) error {
	switch {
	case !f.exists:
		return fmt.Errorf("missing after the write")
	case !bytes.Equal(f.data, content):
		return fmt.Errorf("reads back %q, not %q", f.data, content)
	case f.mode() != 0o440 || f.st.Uid != 0 || f.st.Gid != 0:
		return fmt.Errorf("mode %#o owner %d:%d, not 0440 root:root", f.mode(), f.st.Uid, f.st.Gid)
	}
	if err := checkDropIn(f.data); err != nil {
		return fmt.Errorf("does not parse: %w", err)
	}
	return nil
}
