package execuser

import "path/filepath"

// Covering returns the first of destinations, the destinations of a
// container's mounts, that hides the root filesystem's /etc, /etc/passwd,
// /etc/group or /etc/shadow from the container, or "" if none does: a
// mount there would hide what Provision writes. Destinations are compared
// in their filepath.Clean form, a relative one taken relative to "/".
func Covering(destinations []string) string {
	for _, d := range destinations {
		switch filepath.Join("/", d) {
		case "/etc", "/etc/passwd", "/etc/group", "/etc/shadow":
			return d
		}
	}
	return ""
}
