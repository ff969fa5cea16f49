package execuser

import "testing"

func TestParsePasswdLine(t *testing.T) {
	good := []struct {
		line string
		want Entry
	}{
		{"root:x:0:0:root:/root:/bin/bash", Entry{"root", 0, 0, "/root", "/bin/bash"}},
		{"dev:x:4242:100::/home/dev:", Entry{"dev", 4242, 100, "/home/dev", ""}},
		{"  dev:x:1:2:g:/h:/s", Entry{"dev", 1, 2, "/h", "/s"}},
		{"dev::1:2:::", Entry{"dev", 1, 2, "", ""}},
		{"dev:x:1:2:g:/h:/bin/sh:extra", Entry{"dev", 1, 2, "/h", "/bin/sh:extra"}},
		{"dev:x:4294967295:2:g:/h:/s", Entry{"dev", 4294967295, 2, "/h", "/s"}},
	}
	for _, tc := range good {
		got, ok := parsePasswdLine(tc.line)
		if !ok || got != tc.want {
			t.Errorf("parsePasswdLine(%q) = %+v, %v; want %+v", tc.line, got, ok, tc.want)
		}
	}
	for _, line := range []string{
		"", "   ", "# dev:x:1:2:g:/h:/s", "+dev:x:1:2:g:/h:/s", "-dev:x:1:2:g:/h:/s", "+::::::",
		":x:1:2:g:/h:/s", "dev:x:1:2:g:/h", "dev:x::2:g:/h:/s", "dev:x:1::g:/h:/s",
		"dev:x:a:2:g:/h:/s", "dev:x:-1:2:g:/h:/s", "dev:x: 1:2:g:/h:/s", "dev:x:4294967296:2:g:/h:/s",
	} {
		if e, ok := parsePasswdLine(line); ok {
			t.Errorf("parsePasswdLine(%q) = %+v, want not well-formed", line, e)
		}
	}
}

func TestParseGroupLine(t *testing.T) {
	for line, want := range map[string]group{
		"dev:x:4242:":          {"dev", 4242},
		"dev:x:4242:a,b":       {"dev", 4242},
		"dev:x:4242":           {"dev", 4242},
		"dev::4242:a:b":        {"dev", 4242},
		"\tshadow:x:42:":       {"shadow", 42},
		"nogroup:x:65534:dev,": {"nogroup", 65534},
	} {
		if got, ok := parseGroupLine(line); !ok || got != want {
			t.Errorf("parseGroupLine(%q) = %+v, %v; want %+v", line, got, ok, want)
		}
	}
	for _, line := range []string{"", "#dev:x:1:", "+dev:x:1:", "-dev:x:1:", "dev:x", "dev:x::", ":x:1:", "dev:x:one:"} {
		if g, ok := parseGroupLine(line); ok {
			t.Errorf("parseGroupLine(%q) = %+v, want not well-formed", line, g)
		}
	}
}

func TestFindPasswd(t *testing.T) {
	data := []byte("# users\n+alice\nbad:x:1\ndev:x:1000:1000::/a:/s\ndev:x:1001:1001::/b:/s\nbob:x:1000:5::/c:/s")
	e := findPasswd(data, func(e Entry) bool { return e.Name == "dev" })
	if e == nil || e.UID != 1000 {
		t.Errorf("by name: %+v, want the first dev, uid 1000", e)
	}
	e = findPasswd(data, func(e Entry) bool { return e.UID == 1000 })
	if e == nil || e.Name != "dev" {
		t.Errorf("by uid: %+v, want dev", e)
	}
	e = findPasswd(data, func(e Entry) bool { return e.Name == "bob" })
	if e == nil || e.Home != "/c" {
		t.Errorf("last line without a newline: %+v, want bob", e)
	}
	if e := findPasswd(data, func(e Entry) bool { return e.Name == "alice" || e.Name == "bad" }); e != nil {
		t.Errorf("found %+v, want none", e)
	}
	if e := findPasswd(nil, func(Entry) bool { return true }); e != nil {
		t.Errorf("in nothing: found %+v", e)
	}
}

func TestHasShadow(t *testing.T) {
	data := []byte("root:*:19000:0:99999:7:::\n#dev:!:1::::::\n+bob::::::::\n carol\ndave:broken")
	for name, want := range map[string]bool{"root": true, "dev": false, "bob": false, "carol": true, "dave": true, "ro": false, "": false} {
		if got := hasShadow(data, name); got != want {
			t.Errorf("hasShadow(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestAppendLine(t *testing.T) {
	for in, want := range map[string]string{
		"":         "l\n",
		"a\n":      "a\nl\n",
		"a":        "a\nl\n",
		"a\n\n":    "a\n\nl\n",
		"a\nb\r\n": "a\nb\r\nl\n",
	} {
		if got := string(appendLine([]byte(in), "l")); got != want {
			t.Errorf("appendLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLines(t *testing.T) {
	u := User{"dev", 4242, 100, "/home/dev", "/bin/bash"}
	if got, want := passwdLine(u), "dev:x:4242:100::/home/dev:/bin/bash"; got != want {
		t.Errorf("passwdLine = %q, want %q", got, want)
	}
	if e, ok := parsePasswdLine(passwdLine(u)); !ok || e != (Entry{u.Name, u.UID, u.GID, u.Home, u.Shell}) {
		t.Errorf("passwdLine does not parse back: %+v, %v", e, ok)
	}
	if got, want := groupLine("dev", 4242), "dev:x:4242:"; got != want {
		t.Errorf("groupLine = %q, want %q", got, want)
	}
	if got, want := shadowLine("dev", 20000), "dev:!:20000:0:99999:7:::"; got != want {
		t.Errorf("shadowLine = %q, want %q", got, want)
	}
}
