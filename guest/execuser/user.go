package execuser

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// maxNameLen is the longest user name Validate accepts, in bytes.
const maxNameLen = 32

// maxPathLen is the longest home or shell Validate accepts, in bytes.
const maxPathLen = 4096

// maxID is the largest uid or gid: 4294967295 is (uid_t)-1, which the
// kernel and libc take for "no id".
const maxID = 1<<32 - 2

// User is a user to provision: the io.cocoon.exec-user form
// name:uid:gid[:home[:shell]].
type User struct {
	Name     string
	UID, GID uint32
	Home     string // absolute
	Shell    string // absolute
}

// defaultShell is the shell of a user whose shell field is omitted or empty.
const defaultShell = "/bin/sh"

// Parse parses "name:uid:gid[:home[:shell]]" and validates it. An omitted
// or empty home is "/home/<name>" ("/root" for root); an omitted or empty
// shell is "/bin/sh". Nothing is trimmed: a field with a space in it is
// invalid.
func Parse(s string) (User, error) {
	fields := strings.Split(s, ":")
	if len(fields) < 3 {
		return User{}, fmt.Errorf("exec user %q: %d fields, want name:uid:gid[:home[:shell]]", s, len(fields))
	}
	if len(fields) > 5 {
		return User{}, fmt.Errorf("exec user %q: %d fields, want at most 5 (name:uid:gid:home:shell); no field may contain ':'", s, len(fields))
	}
	u := User{Name: fields[0], Shell: defaultShell}
	if len(fields) > 3 && fields[3] != "" {
		u.Home = fields[3]
	} else {
		u.Home = defaultHome(u.Name)
	}
	if len(fields) > 4 && fields[4] != "" {
		u.Shell = fields[4]
	}
	if err := checkName(u.Name); err != nil {
		return User{}, fmt.Errorf("exec user %q: %w", s, err)
	}
	var err error
	if u.UID, err = parseID("uid", fields[1]); err != nil {
		return User{}, fmt.Errorf("exec user %q: %w", s, err)
	}
	if u.GID, err = parseID("gid", fields[2]); err != nil {
		return User{}, fmt.Errorf("exec user %q: %w", s, err)
	}
	if err := u.check(); err != nil {
		return User{}, fmt.Errorf("exec user %q: %w", s, err)
	}
	return u, nil
}

// defaultHome is the home of a user named name whose home is not given.
func defaultHome(name string) string {
	if name == "root" {
		return "/root"
	}
	return "/home/" + name
}

// Validate checks every field of u. The error names the user, the field
// and the problem, as in
//
//	exec user "dev:0:0:/home/dev:/bin/sh": uid 0 is root's: name it root
func (u User) Validate() error {
	if err := u.check(); err != nil {
		return fmt.Errorf("exec user %q: %w", u.String(), err)
	}
	return nil
}

// check is Validate without the user's name in the error.
func (u User) check() error {
	if err := checkName(u.Name); err != nil {
		return err
	}
	if u.UID > maxID {
		return fmt.Errorf("uid %d is out of range (0..%d)", u.UID, uint32(maxID))
	}
	if u.GID > maxID {
		return fmt.Errorf("gid %d is out of range (0..%d)", u.GID, uint32(maxID))
	}
	if u.UID == 0 && u.Name != "root" {
		return fmt.Errorf("uid 0 is root's: name it root")
	}
	if err := checkPath("home", u.Home); err != nil {
		return err
	}
	return checkPath("shell", u.Shell)
}

// String returns the canonical form of u, "name:uid:gid:home:shell",
// which Parse turns back into u.
func (u User) String() string {
	return u.Name + ":" + strconv.FormatUint(uint64(u.UID), 10) + ":" +
		strconv.FormatUint(uint64(u.GID), 10) + ":" + u.Home + ":" + u.Shell
}

// checkName checks a user name: 1 to 32 of [A-Za-z0-9._-], not starting
// with '-' or '.', not all digits.
func checkName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("name is empty")
	case strings.Contains(name, ":"):
		return fmt.Errorf("name %q contains ':', which separates the fields of passwd", name)
	case strings.ContainsAny(name, "\n\r"):
		return fmt.Errorf("name %q contains a line break, which ends an entry of passwd", name)
	case len(name) > maxNameLen:
		return fmt.Errorf("name %q is %d bytes long, more than %d", name, len(name), maxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !nameByte(c) {
			return fmt.Errorf("name %q contains %q: only letters, digits, '.', '_' and '-' are allowed", name, string(rune(c)))
		}
	}
	switch {
	case name[0] == '-':
		return fmt.Errorf("name %q starts with '-', which reads as an option", name)
	case name[0] == '.':
		return fmt.Errorf("name %q starts with '.'", name)
	case allDigits(name):
		return fmt.Errorf("name %q is all digits, which reads as a uid", name)
	}
	return nil
}

// nameByte reports whether c may be part of a user name.
func nameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}

// allDigits reports whether s is non-empty and only decimal digits.
func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseID parses the decimal uid or gid s; field names it in the error.
func parseID(field, s string) (uint32, error) {
	if !allDigits(s) {
		return 0, fmt.Errorf("%s %q is not a number", field, s)
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > maxID {
		return 0, fmt.Errorf("%s %s is out of range (0..%d)", field, s, uint32(maxID))
	}
	return uint32(n), nil
}

// checkPath checks a home or shell: absolute, in its filepath.Clean form,
// no ':', line break or NUL, at most 4096 bytes.
func checkPath(field, p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%s is empty", field)
	case len(p) > maxPathLen:
		return fmt.Errorf("%s is %d bytes long, more than %d", field, len(p), maxPathLen)
	case strings.Contains(p, ":"):
		return fmt.Errorf("%s %q contains ':', which separates the fields of passwd", field, p)
	case strings.ContainsAny(p, "\n\r"):
		return fmt.Errorf("%s %q contains a line break, which ends an entry of passwd", field, p)
	case strings.Contains(p, "\x00"):
		return fmt.Errorf("%s %q contains a NUL byte", field, p)
	case !filepath.IsAbs(p):
		return fmt.Errorf("%s %q is not an absolute path", field, p)
	case filepath.Clean(p) != p:
		return fmt.Errorf("%s %q is not in its clean form %q", field, p, filepath.Clean(p))
	}
	return nil
}
