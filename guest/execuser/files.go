package execuser

import (
	"strconv"
	"strings"
)

// The files' lines are read the way the nss "files" source of glibc reads
// them: leading blanks are skipped; empty lines, comments ('#') and the
// compat lines starting with '+' or '-' are not entries; a line that does
// not parse is skipped; the first well-formed match wins. An entry's last
// field (passwd's shell, group's member list) is the rest of the line.

// group is a group entry.
type group struct {
	name string
	gid  uint32
}

// entryLine returns line without its leading blanks, and false when the
// line cannot be an entry.
func entryLine(line string) (string, bool) {
	line = strings.TrimLeft(line, " \t\v\f\r")
	if line == "" || line[0] == '#' || line[0] == '+' || line[0] == '-' {
		return "", false
	}
	return line, true
}

// parsePasswdLine parses a line of passwd,
// name:password:uid:gid:gecos:home:shell.
func parsePasswdLine(line string) (Entry, bool) {
	line, ok := entryLine(line)
	if !ok {
		return Entry{}, false
	}
	f := strings.SplitN(line, ":", 7)
	if len(f) != 7 || f[0] == "" {
		return Entry{}, false
	}
	uid, ok1 := parseField(f[2])
	gid, ok2 := parseField(f[3])
	if !ok1 || !ok2 {
		return Entry{}, false
	}
	return Entry{Name: f[0], UID: uid, GID: gid, Home: f[5], Shell: f[6]}, true
}

// parseGroupLine parses a line of group, name:password:gid[:members].
func parseGroupLine(line string) (group, bool) {
	line, ok := entryLine(line)
	if !ok {
		return group{}, false
	}
	f := strings.SplitN(line, ":", 4)
	if len(f) < 3 || f[0] == "" {
		return group{}, false
	}
	gid, ok := parseField(f[2])
	if !ok {
		return group{}, false
	}
	return group{name: f[0], gid: gid}, true
}

// parseField parses a uid or gid field: decimal digits, at most
// 4294967295.
func parseField(s string) (uint32, bool) {
	if !allDigits(s) {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

// lines calls f with each line of data, without its newline, until f
// returns false.
func lines(data []byte, f func(line string) bool) {
	s := string(data)
	for s != "" {
		line, rest, _ := strings.Cut(s, "\n")
		if !f(line) {
			return
		}
		s = rest
	}
}

// findPasswd returns the first well-formed entry of passwd data match
// accepts, or nil.
func findPasswd(data []byte, match func(Entry) bool) *Entry {
	var found *Entry
	lines(data, func(line string) bool {
		if e, ok := parsePasswdLine(line); ok && match(e) {
			found = &e
			return false
		}
		return true
	})
	return found
}

// findGroup returns the first well-formed entry of group data match
// accepts, or nil.
func findGroup(data []byte, match func(group) bool) *group {
	var found *group
	lines(data, func(line string) bool {
		if g, ok := parseGroupLine(line); ok && match(g) {
			found = &g
			return false
		}
		return true
	})
	return found
}

// hasShadow reports whether shadow data has a line for name. Any line
// whose first field is name counts, well-formed or not, so that no second
// one is added.
func hasShadow(data []byte, name string) bool {
	found := false
	lines(data, func(line string) bool {
		line, ok := entryLine(line)
		if !ok {
			return true
		}
		first, _, _ := strings.Cut(line, ":")
		found = first == name
		return !found
	})
	return found
}

// appendLine returns data with line and a newline appended, after a
// newline ending data's last line if it has none.
func appendLine(data []byte, line string) []byte {
	out := make([]byte, 0, len(data)+len(line)+2)
	out = append(out, data...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	out = append(out, line...)
	return append(out, '\n')
}

// passwdLine is u's passwd line, with a locked-by-shadow password and an
// empty gecos.
func passwdLine(u User) string {
	return u.Name + ":x:" + strconv.FormatUint(uint64(u.UID), 10) + ":" +
		strconv.FormatUint(uint64(u.GID), 10) + "::" + u.Home + ":" + u.Shell
}

// groupLine is the line of the group named name with id gid and no
// members.
func groupLine(name string, gid uint32) string {
	return name + ":x:" + strconv.FormatUint(uint64(gid), 10) + ":"
}

// shadowLine is the shadow line of name with a locked password, changed
// on day (days since 1970-01-01), and the usual ageing fields.
func shadowLine(name string, day int64) string {
	return name + ":!:" + strconv.FormatInt(day, 10) + ":0:99999:7:::"
}
