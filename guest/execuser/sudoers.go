package execuser

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// sudoersDir is the directory sudoers must include for the drop-in to
// count.
const sudoersDir = "/etc/sudoers.d"

// sudoersUser is how the drop-in names the user: by name, or by "#uid"
// when sudo would read the name as something else, such as ALL or an
// alias (an upper-case word).
func sudoersUser(name string, uid uint32) string {
	if sudoersName(name) {
		return name
	}
	return "#" + strconv.FormatUint(uint64(uid), 10)
}

// sudoersName reports whether sudo reads name, at the start of a rule, as
// that user's name.
func sudoersName(name string) bool {
	if checkName(name) != nil || aliasName(name) {
		return false
	}
	switch name {
	case "Defaults", "User_Alias", "Runas_Alias", "Host_Alias", "Cmnd_Alias", "Cmd_Alias":
		return false
	}
	return true
}

// aliasName reports whether sudo reads word as an alias name (or ALL):
// an upper-case letter, then upper-case letters, digits and underscores.
func aliasName(word string) bool {
	if word == "" || word[0] < 'A' || word[0] > 'Z' {
		return false
	}
	for i := 1; i < len(word); i++ {
		c := word[i]
		if !('A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// dropInContent is the drop-in granting user (a sudoersUser) every
// command as anyone without a password.
func dropInContent(user string) []byte {
	return []byte(user + " ALL=(ALL:ALL) NOPASSWD: ALL\n")
}

// checkDropIn checks a drop-in the way visudo -c would, for the grammar a
// drop-in of Provision uses: comments, empty lines and rules of the form
//
//	User Host=(Runas[:Group]) [NOPASSWD:] Command
//
// It requires at least one rule.
func checkDropIn(data []byte) error {
	rules, n := 0, 0
	var err error
	lines(data, func(line string) bool {
		n++
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' && !startsWithUID(line) && !strings.HasPrefix(line, "#include") {
			return true
		}
		if err = checkRule(line); err != nil {
			err = fmt.Errorf("line %d: %w", n, err)
			return false
		}
		rules++
		return true
	})
	if err != nil {
		return err
	}
	if rules == 0 {
		return fmt.Errorf("no rule")
	}
	return nil
}

// startsWithUID reports whether line starts with a "#uid" user, which
// sudoers does not read as a comment.
func startsWithUID(line string) bool {
	return len(line) > 1 && line[0] == '#' && '0' <= line[1] && line[1] <= '9'
}

// checkRule checks one rule, User Host=(Runas[:Group]) [NOPASSWD:] Command.
func checkRule(line string) error {
	if strings.HasSuffix(line, `\`) {
		return fmt.Errorf("continued lines are not supported")
	}
	i := strings.IndexAny(line, " \t")
	if i < 0 {
		return fmt.Errorf("%q is not a rule", line)
	}
	user, rest := line[:i], line[i+1:]
	if !sudoersUserSpec(user) {
		return fmt.Errorf("%q is not a user", user)
	}
	host, rest, ok := strings.Cut(rest, "=")
	host = strings.TrimSpace(host)
	if !ok || !hostSpec(host) {
		return fmt.Errorf("%q is not a host followed by '='", host)
	}
	rest = strings.TrimSpace(rest)
	if !strings.HasPrefix(rest, "(") {
		return fmt.Errorf("no run-as list in %q", rest)
	}
	runas, rest, ok := strings.Cut(rest[1:], ")")
	if !ok {
		return fmt.Errorf("unterminated run-as list")
	}
	runUser, runGroup, hasGroup := strings.Cut(runas, ":")
	if !runasSpec(strings.TrimSpace(runUser)) {
		return fmt.Errorf("run-as user %q is not a user", runUser)
	}
	if hasGroup && !runasSpec(strings.TrimSpace(runGroup)) {
		return fmt.Errorf("run-as group %q is not a group", runGroup)
	}
	rest = strings.TrimSpace(rest)
	if after, ok := strings.CutPrefix(rest, "NOPASSWD:"); ok {
		rest = strings.TrimSpace(after)
	}
	if !commandSpec(rest) {
		return fmt.Errorf("%q is not a command", rest)
	}
	return nil
}

// sudoersUserSpec reports whether s is a user the rule applies to: a
// name or "#uid".
func sudoersUserSpec(s string) bool {
	if uid, ok := strings.CutPrefix(s, "#"); ok {
		_, ok := parseField(uid)
		return ok
	}
	return sudoersName(s)
}

// runasSpec reports whether s is a run-as user or group: ALL, a name or
// "#id".
func runasSpec(s string) bool {
	return s == "ALL" || sudoersUserSpec(s)
}

// hostSpec reports whether s is ALL or a host name.
func hostSpec(s string) bool {
	if s == "ALL" {
		return true
	}
	if s == "" || aliasName(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !nameByte(c) {
			return false
		}
	}
	return true
}

// commandSpec reports whether s is ALL or an absolute command with
// plain arguments.
func commandSpec(s string) bool {
	if s == "ALL" {
		return true
	}
	if !strings.HasPrefix(s, "/") {
		return false
	}
	return !strings.ContainsAny(s, `,:=()\#"`+"\x00")
}

// includesDropIns reports whether sudoers data includes /etc/sudoers.d
// with an @includedir or #includedir line (a relative directory is
// relative to /etc).
func includesDropIns(data []byte) bool {
	found := false
	lines(data, func(line string) bool {
		f := strings.Fields(line)
		if len(f) != 2 || f[0] != "@includedir" && f[0] != "#includedir" {
			return true
		}
		dir := strings.Trim(f[1], `"`)
		if !filepath.IsAbs(dir) {
			dir = filepath.Join("/etc", dir)
		}
		found = filepath.Clean(dir) == sudoersDir
		return !found
	})
	return found
}
