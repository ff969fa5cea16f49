package execuser

import "testing"

func TestSudoersUser(t *testing.T) {
	for name, want := range map[string]string{
		"dev":        "dev",
		"www-data":   "www-data",
		"john.doe":   "john.doe",
		"Dev":        "Dev",
		"_apt":       "_apt",
		"1dev":       "1dev",
		"ALL":        "#4242",
		"DEV":        "#4242",
		"D_1":        "#4242",
		"Defaults":   "#4242",
		"Cmnd_Alias": "#4242",
		"a b":        "#4242",
		"%wheel":     "#4242",
		"a,b":        "#4242",
		"":           "#4242",
	} {
		if got := sudoersUser(name, 4242); got != want {
			t.Errorf("sudoersUser(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestCheckDropIn(t *testing.T) {
	good := []string{
		"dev ALL=(ALL:ALL) NOPASSWD: ALL\n",
		string(dropInContent("dev")),
		string(dropInContent("#4242")),
		"# a comment\n\ndev ALL=(ALL:ALL) NOPASSWD: ALL",
		"dev\tALL = (ALL) ALL\n",
		"dev ALL=(root:wheel) NOPASSWD:/usr/bin/id -u\n",
		"dev host-1=(#0) /bin/true\n",
	}
	for _, s := range good {
		if err := checkDropIn([]byte(s)); err != nil {
			t.Errorf("checkDropIn(%q): %v", s, err)
		}
	}
	bad := []string{
		"",
		"# only a comment\n",
		"dev\n",
		"dev ALL\n",
		"dev ALL=ALL\n",
		"dev ALL=(ALL:ALL NOPASSWD: ALL\n",
		"dev ALL=(ALL:ALL) NOPASSWD: \n",
		"dev ALL=(ALL:ALL) NOPASSWD: ALL, /bin/sh\n",
		"dev ALL=(ALL:ALL) NOPASSWD: bin/sh\n",
		"dev ALL=(ALL:ALL) PASSWD ALL\n",
		"ALL ALL=(ALL:ALL) NOPASSWD: ALL\n",
		"DEV ALL=(ALL:ALL) NOPASSWD: ALL\n",
		"Defaults ALL=(ALL:ALL) NOPASSWD: ALL\n",
		"%sudo ALL=(ALL:ALL) ALL\n",
		"#include /etc/other\n",
		"#includedir /etc/sudoers.d\n",
		"dev ALL=(ALL:ALL) \\\nNOPASSWD: ALL\n",
		"dev ALL=(ALL:ALL) NOPASSWD: ALL\ngarbage\n",
		"dev ALL=(a b) ALL\n",
		"dev ALL=(ALL:) ALL\n",
		"#42x ALL=(ALL) ALL\n",
	}
	for _, s := range bad {
		if err := checkDropIn([]byte(s)); err == nil {
			t.Errorf("checkDropIn(%q) = nil, want an error", s)
		}
	}
}

func TestIncludesDropIns(t *testing.T) {
	good := []string{
		"@includedir /etc/sudoers.d\n",
		"#includedir /etc/sudoers.d\n",
		"Defaults env_reset\nroot ALL=(ALL:ALL) ALL\n@includedir /etc/sudoers.d",
		"  @includedir   /etc/sudoers.d/  \n",
		"@includedir \"/etc/sudoers.d\"\n",
		"@includedir sudoers.d\n",
	}
	for _, s := range good {
		if !includesDropIns([]byte(s)) {
			t.Errorf("includesDropIns(%q) = false", s)
		}
	}
	bad := []string{
		"",
		"# includedir /etc/sudoers.d\n",
		"## @includedir /etc/sudoers.d\n",
		"@includedir /etc/sudoers.dd\n",
		"@include /etc/sudoers.d\n",
		"@includedir /etc/sudoers.d extra\n",
		"@includedir /usr/local/etc/sudoers.d\n",
	}
	for _, s := range bad {
		if includesDropIns([]byte(s)) {
			t.Errorf("includesDropIns(%q) = true", s)
		}
	}
}
