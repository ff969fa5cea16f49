package execuser

import "testing"

func TestCovering(t *testing.T) {
	for _, d := range []string{"/etc", "/etc/", "/etc/passwd", "/etc//group", "/etc/shadow", "/etc/./passwd", "etc", "/etc/../etc"} {
		if got := Covering([]string{"/proc", d, "/etc"}); got != d {
			t.Errorf("Covering(%q) = %q, want %q", d, got, d)
		}
	}
	for _, d := range []string{"/etc/hosts", "/etcfoo", "/", "", "/etc/passwd-", "/etc/gshadow", "/var/etc", "/etc/sudoers.d"} {
		if got := Covering([]string{d}); got != "" {
			t.Errorf("Covering(%q) = %q, want none", d, got)
		}
	}
	if got := Covering(nil); got != "" {
		t.Errorf("Covering(nil) = %q", got)
	}
	if got := Covering([]string{"/dev", "/etc/group", "/etc"}); got != "/etc/group" {
		t.Errorf("Covering: %q, want the first, /etc/group", got)
	}
}
