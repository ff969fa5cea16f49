package execuser

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	good := []struct {
		in   string
		want User
	}{
		{"dev:4242:4242", User{"dev", 4242, 4242, "/home/dev", "/bin/sh"}},
		{"dev:4242:100:/srv/dev", User{"dev", 4242, 100, "/srv/dev", "/bin/sh"}},
		{"dev:4242:4242::/bin/bash", User{"dev", 4242, 4242, "/home/dev", "/bin/bash"}},
		{"dev:4242:4242:/home/dev:", User{"dev", 4242, 4242, "/home/dev", "/bin/sh"}},
		{"dev:4242:4242::", User{"dev", 4242, 4242, "/home/dev", "/bin/sh"}},
		{"root:0:0", User{"root", 0, 0, "/root", "/bin/sh"}},
		{"root:0:0:/:/bin/ash", User{"root", 0, 0, "/", "/bin/ash"}},
		{"a.b_c-d:1:2", User{"a.b_c-d", 1, 2, "/home/a.b_c-d", "/bin/sh"}},
		{"Dev1:4294967294:4294967294", User{"Dev1", 4294967294, 4294967294, "/home/Dev1", "/bin/sh"}},
		{"_apt:42:65534", User{"_apt", 42, 65534, "/home/_apt", "/bin/sh"}},
		{"1dev:5:5", User{"1dev", 5, 5, "/home/1dev", "/bin/sh"}},
		{strings.Repeat("a", 32) + ":7:7", User{strings.Repeat("a", 32), 7, 7, "/home/" + strings.Repeat("a", 32), "/bin/sh"}},
	}
	for _, tc := range good {
		got, err := Parse(tc.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("Parse(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("Parse(%q).Validate(): %v", tc.in, err)
		}
		again, err := Parse(got.String())
		if err != nil || again != got {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", got.String(), again, err, got)
		}
	}

	bad := []struct {
		in, want string // want: a substring of the error
	}{
		{"", "1 fields"},
		{"dev", "1 fields"},
		{"dev:4242", "2 fields"},
		{"dev:4242:4242:/home/dev:/bin/sh:x", "6 fields"},
		{"dev:4242:4242:/home/d:ev:/bin/sh", "6 fields"},
		{"a:b:c", `exec user "a:b:c": uid "b" is not a number`},
		{"dev:4242:x", `gid "x" is not a number`},
		{"dev::4242", `uid "" is not a number`},
		{"dev:-1:4242", `uid "-1" is not a number`},
		{"dev:+1:4242", `uid "+1" is not a number`},
		{"dev: 4242:4242", `uid " 4242" is not a number`},
		{"dev:4242 :4242", `uid "4242 " is not a number`},
		{"dev:0x10:4242", `uid "0x10" is not a number`},
		{"dev:4294967295:4242", "uid 4294967295 is out of range (0..4294967294)"},
		{"dev:4242:4294967295", "gid 4294967295 is out of range"},
		{"dev:99999999999999999999999:1", "uid 99999999999999999999999 is out of range"},
		{"dev:0:0", "uid 0 is root's: name it root"},
		{"toor:0:100", "uid 0 is root's: name it root"},
		{":4242:4242", "name is empty"},
		{" dev:4242:4242", `name " dev" contains " "`},
		{"dev :4242:4242", `name "dev " contains " "`},
		{"de v:4242:4242", `contains " "`},
		{"dev\n:4242:4242", "line break"},
		{"dev\nroot::0:4242", "line break"},
		{"-dev:4242:4242", `name "-dev" starts with '-'`},
		{".dev:4242:4242", `name ".dev" starts with '.'`},
		{"dev$:4242:4242", `contains "$"`},
		{"d/ev:4242:4242", `contains "/"`},
		{"dév:4242:4242", "only letters, digits"},
		{"dev\x00:4242:4242", "only letters, digits"},
		{strings.Repeat("a", 33) + ":4242:4242", "33 bytes long, more than 32"},
		{"4242:4242:4242", `name "4242" is all digits`},
		{"0:0:0", "all digits"},
		{"dev:4242:4242:home/dev", `home "home/dev" is not an absolute path`},
		{"dev:4242:4242:/home/dev/", `home "/home/dev/" is not in its clean form "/home/dev"`},
		{"dev:4242:4242:/home/../dev", "not in its clean form"},
		{"dev:4242:4242:/home//dev", "not in its clean form"},
		{"dev:4242:4242:/home/./dev", "not in its clean form"},
		{"dev:4242:4242:/home/dev\n", "line break"},
		{"dev:4242:4242:/home/d\x00ev", "NUL"},
		{"dev:4242:4242:/" + strings.Repeat("a", 4096), "4097 bytes long, more than 4096"},
		{"dev:4242:4242::bin/sh", `shell "bin/sh" is not an absolute path`},
		{"dev:4242:4242::sh", `shell "sh" is not an absolute path`},
		{"dev:4242:4242::/bin/sh/", "not in its clean form"},
		{"dev:4242:4242:: /bin/sh", "not an absolute path"},
	}
	for _, tc := range bad {
		u, err := Parse(tc.in)
		if err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", tc.in, u)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): %v, want %q in it", tc.in, err, tc.want)
		}
		if !strings.HasPrefix(err.Error(), "exec user ") {
			t.Errorf("Parse(%q): %v, want it to name the exec user", tc.in, err)
		}
	}
}

func TestValidate(t *testing.T) {
	ok := User{"dev", 4242, 4242, "/home/dev", "/bin/sh"}
	bad := []struct {
		u    User
		want string
	}{
		{User{"a:b", 1, 1, "/h", "/s"}, `name "a:b" contains ':'`},
		{User{"a\nb", 1, 1, "/h", "/s"}, `name "a\nb" contains a line break`},
		{User{"dev", 4294967295, 1, "/h", "/s"}, "uid 4294967295 is out of range"},
		{User{"dev", 1, 4294967295, "/h", "/s"}, "gid 4294967295 is out of range"},
		{User{"dev", 0, 0, "/h", "/s"}, "uid 0 is root's: name it root"},
		{User{"dev", 1, 1, "", "/s"}, "home is empty"},
		{User{"dev", 1, 1, "/h", ""}, "shell is empty"},
		{User{"dev", 1, 1, "/h:x", "/s"}, `home "/h:x" contains ':'`},
		{User{"dev", 1, 1, "/h", "/s:x"}, `shell "/s:x" contains ':'`},
		{User{"dev", 1, 1, "/h", "/s\n"}, "shell \"/s\\n\" contains a line break"},
	}
	if err := ok.Validate(); err != nil {
		t.Errorf("%+v.Validate(): %v", ok, err)
	}
	for _, tc := range bad {
		err := tc.u.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v.Validate() = %v, want %q in it", tc.u, err, tc.want)
		}
	}
	want := `exec user "dev:0:0:/h:/s": uid 0 is root's: name it root`
	if err := (User{"dev", 0, 0, "/h", "/s"}).Validate(); err == nil || err.Error() != want {
		t.Errorf("Validate() = %v, want %s", err, want)
	}
}

func TestString(t *testing.T) {
	u := User{"dev", 4242, 100, "/home/dev", "/bin/bash"}
	if got, want := u.String(), "dev:4242:100:/home/dev:/bin/bash"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
