//go:build linux

package execuser

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// testShadowDay is testDay as shadow dates it.
var testShadowDay = strconv.FormatInt(testDay.Unix()/86400, 10)

func TestProvisionDebian(t *testing.T) {
	root := debianRoot(t)
	u := mustParse(t, "dev:4242:4242::/bin/bash")
	rep, err := provision(t, root, u, Options{Sudo: true})
	if err != nil {
		t.Fatal(err)
	}
	want := Report{Passwd: Created, Group: Created, Shadow: Created, Home: Created, Sudo: Written}
	if rep.Passwd != want.Passwd || rep.Group != want.Group || rep.Shadow != want.Shadow || rep.Home != want.Home || rep.Sudo != want.Sudo {
		t.Errorf("report %+v, want %+v", rep, want)
	}
	entry := Entry{"dev", 4242, 4242, "/home/dev", "/bin/bash"}
	if rep.ByName == nil || *rep.ByName != entry || rep.ByUID == nil || *rep.ByUID != entry {
		t.Errorf("lookups found %+v by name and %+v by uid, want %+v", rep.ByName, rep.ByUID, entry)
	}
	if len(rep.Notes) != 0 {
		t.Errorf("notes %q, want none", rep.Notes)
	}

	if got, want := read(t, root, "etc/passwd"), debianPasswd+"dev:x:4242:4242::/home/dev:/bin/bash\n"; got != want {
		t.Errorf("passwd:\n%s\nwant:\n%s", got, want)
	}
	if got, want := read(t, root, "etc/group"), debianGroup+"dev:x:4242:\n"; got != want {
		t.Errorf("group:\n%s\nwant:\n%s", got, want)
	}
	if got, want := read(t, root, "etc/shadow"), debianShadow+"dev:!:"+testShadowDay+":0:99999:7:::\n"; got != want {
		t.Errorf("shadow:\n%s\nwant:\n%s", got, want)
	}
	checkStat(t, root, "etc/passwd", 0o644, 0, 0)
	checkStat(t, root, "etc/group", 0o644, 0, 42)
	checkStat(t, root, "etc/shadow", 0o640, 0, 42)
	checkStat(t, root, "home", os.ModeDir|0o755, 0, 0)
	checkStat(t, root, "home/dev", os.ModeDir|0o700, 4242, 4242)
	checkStat(t, root, "etc/sudoers.d/cocoon-exec-user", 0o440, 0, 0)
	if got, want := read(t, root, SudoersDropIn), "dev ALL=(ALL:ALL) NOPASSWD: ALL\n"; got != want {
		t.Errorf("drop-in %q, want %q", got, want)
	}
	noTemporaries(t, root, "etc", "etc/sudoers.d")

	e, err := LookupName(root, "dev")
	if err != nil || e == nil || *e != entry {
		t.Errorf("LookupName: %+v, %v", e, err)
	}
}

func TestProvisionIdempotent(t *testing.T) {
	root := debianRoot(t)
	u := mustParse(t, "dev:4242:4242")
	if _, err := provision(t, root, u, Options{Sudo: true}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, root)
	rep, err := provision(t, root, u, Options{Sudo: true})
	if err != nil {
		t.Fatal(err)
	}
	for item, s := range map[string]Status{"passwd": rep.Passwd, "group": rep.Group, "shadow": rep.Shadow, "home": rep.Home, "sudo": rep.Sudo} {
		if s != Existed {
			t.Errorf("%s: %s, want %s", item, s, Existed)
		}
	}
	if len(rep.Notes) != 0 {
		t.Errorf("notes %q, want none", rep.Notes)
	}
	if rep.ByName == nil || rep.ByUID == nil || rep.ByUID.Name != "dev" {
		t.Errorf("lookups %+v, %+v", rep.ByName, rep.ByUID)
	}
	if after := snapshot(t, root); after != before {
		t.Errorf("the second provisioning changed the root:\n%s\nwas:\n%s", after, before)
	}
}

func TestProvisionConcurrent(t *testing.T) {
	root := debianRoot(t)
	u := mustParse(t, "dev:4242:4242")
	var wg sync.WaitGroup
	reports := make([]Report, 16)
	errs := make([]error, 16)
	for i := range reports {
		wg.Go(func() { reports[i], errs[i] = provision(t, root, u, Options{Sudo: i%2 == 0}) })
	}
	wg.Wait()
	created := 0
	for i := range reports {
		if errs[i] != nil {
			t.Errorf("caller %d: %v", i, errs[i])
		}
		if reports[i].Passwd == Created {
			created++
		}
	}
	if created != 1 {
		t.Errorf("%d callers created the entry, want 1", created)
	}
	for _, f := range []string{"etc/passwd", "etc/group", "etc/shadow"} {
		if n := countLines(read(t, root, f), "dev:"); n != 1 {
			t.Errorf("%s has %d lines for dev, want 1", f, n)
		}
	}
	noTemporaries(t, root, "etc", "etc/sudoers.d")
}

func TestProvisionExistingUID(t *testing.T) {
	root := debianRoot(t)
	writeFile(t, root, "etc/passwd", debianPasswd+"alice:x:4242:100::/home/alice:/bin/bash\n", 0o644, 0, 0)
	before := snapshot(t, filepath.Join(root, "etc"))
	rep, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{Sudo: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Passwd != Existed || rep.Shadow != Absent || rep.Home != Absent || rep.Group != Created || rep.Sudo != Written {
		t.Errorf("report %+v", rep)
	}
	if !hasNote(rep, "uid 4242 already has an entry (alice): left as it is") {
		t.Errorf("notes %q, want one about alice", rep.Notes)
	}
	alice := Entry{"alice", 4242, 100, "/home/alice", "/bin/bash"}
	if rep.ByUID == nil || *rep.ByUID != alice || rep.ByName != nil {
		t.Errorf("lookups found %+v by name and %+v by uid, want none and %+v", rep.ByName, rep.ByUID, alice)
	}
	if got := read(t, root, "etc/passwd"); got != debianPasswd+"alice:x:4242:100::/home/alice:/bin/bash\n" {
		t.Errorf("passwd changed:\n%s", got)
	}
	if got := read(t, root, "etc/shadow"); got != debianShadow {
		t.Errorf("shadow changed:\n%s", got)
	}
	for _, home := range []string{"home/dev", "home/alice"} {
		if _, err := os.Lstat(filepath.Join(root, home)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want it not made", home, err)
		}
	}
	if got, want := read(t, root, SudoersDropIn), "alice ALL=(ALL:ALL) NOPASSWD: ALL\n"; got != want {
		t.Errorf("drop-in %q, want %q", got, want)
	}
	if snapshot(t, filepath.Join(root, "etc")) == before {
		t.Errorf("group and drop-in not written")
	}

	// With the existing entry's shadow line and home.
	writeFile(t, root, "etc/shadow", debianShadow+"alice:!:1:0:99999:7:::\n", 0o640, 0, 42)
	if err := os.Mkdir(filepath.Join(root, "home/alice"), 0o700); err != nil {
		t.Fatal(err)
	}
	rep, err = provision(t, root, mustParse(t, "dev:4242:4242"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Passwd != Existed || rep.Shadow != Existed || rep.Home != Existed || rep.Group != Existed || rep.Sudo != Removed {
		t.Errorf("report %+v", rep)
	}
	if got := read(t, root, "etc/shadow"); got != debianShadow+"alice:!:1:0:99999:7:::\n" {
		t.Errorf("shadow changed:\n%s", got)
	}
}

func TestProvisionExistingSameName(t *testing.T) {
	root := debianRoot(t)
	writeFile(t, root, "etc/passwd", debianPasswd+"dev:x:4242:100::/srv/dev:/bin/zsh", 0o644, 0, 0)
	rep, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Passwd != Existed || rep.Shadow != Absent || rep.Home != Absent {
		t.Errorf("report %+v", rep)
	}
	if !hasNote(rep, `uid 4242 already has an entry (dev) with gid 100, home "/srv/dev", shell "/bin/zsh": left as it is`) {
		t.Errorf("notes %q", rep.Notes)
	}
}

func TestProvisionConflict(t *testing.T) {
	for _, tc := range []struct {
		name, user, passwd, group, want string
	}{
		{"passwd", "daemon:4242:4242", debianPasswd, debianGroup, "/etc/passwd: daemon is uid 1, not 4242"},
		{"group", "dev:4242:4242", debianPasswd, debianGroup + "dev:x:5000:\n", "/etc/group: group dev is gid 5000, not 4242"},
		{"after a comment", "dev:4242:4242", "# dev:x:4242:4242::/:/bin/sh\n" + debianPasswd + "dev:x:1000:1000::/home/dev:/bin/sh\n", debianGroup, "dev is uid 1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := debianRoot(t)
			writeFile(t, root, "etc/passwd", tc.passwd, 0o644, 0, 0)
			writeFile(t, root, "etc/group", tc.group, 0o644, 0, 0)
			before := snapshot(t, root)
			_, err := provision(t, root, mustParse(t, tc.user), Options{Sudo: true})
			if !errors.Is(err, ErrConflict) {
				t.Fatalf("error %v, want ErrConflict", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want %q in it", err, tc.want)
			}
			if after := snapshot(t, root); after != before {
				t.Errorf("files changed:\n%s\nwas:\n%s", after, before)
			}
		})
	}
}

func TestProvisionMissingFiles(t *testing.T) {
	needRoot(t)
	t.Run("no etc", func(t *testing.T) {
		root := t.TempDir()
		rep, err := provision(t, root, mustParse(t, "dev:4242:4243"), Options{Sudo: true})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Passwd != Created || rep.Group != Created || rep.Shadow != Absent || rep.Home != Created || rep.Sudo != NoSudo {
			t.Errorf("report %+v", rep)
		}
		if !hasNote(rep, "/etc/shadow does not exist") {
			t.Errorf("notes %q", rep.Notes)
		}
		checkStat(t, root, "etc", os.ModeDir|0o755, 0, 0)
		checkStat(t, root, "etc/passwd", 0o644, 0, 0)
		checkStat(t, root, "etc/group", 0o644, 0, 0)
		checkStat(t, root, "home", os.ModeDir|0o755, 0, 0)
		checkStat(t, root, "home/dev", os.ModeDir|0o700, 4242, 4243)
		if got, want := read(t, root, "etc/passwd"), "dev:x:4242:4243::/home/dev:/bin/sh\n"; got != want {
			t.Errorf("passwd %q, want %q", got, want)
		}
		if got, want := read(t, root, "etc/group"), "dev:x:4243:\n"; got != want {
			t.Errorf("group %q, want %q", got, want)
		}
		for _, p := range []string{"etc/shadow", "etc/sudoers.d"} {
			if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
				t.Errorf("%s: %v, want it not made", p, err)
			}
		}
	})
	t.Run("no passwd", func(t *testing.T) {
		root := debianRoot(t)
		os.Remove(filepath.Join(root, "etc/passwd"))
		os.Remove(filepath.Join(root, "etc/shadow"))
		writeFile(t, root, "etc/group", "root:x:0:", 0o600, 0, 0)
		rep, err := provision(t, root, mustParse(t, "dev:4242:4242:/srv/users/dev"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Passwd != Created || rep.Group != Created || rep.Shadow != Absent || rep.Home != Created || rep.Sudo != Off {
			t.Errorf("report %+v", rep)
		}
		if got, want := read(t, root, "etc/group"), "root:x:0:\ndev:x:4242:\n"; got != want {
			t.Errorf("group %q, want %q", got, want)
		}
		checkStat(t, root, "etc/group", 0o600, 0, 0)
		checkStat(t, root, "srv", os.ModeDir|0o755, 0, 0)
		checkStat(t, root, "srv/users", os.ModeDir|0o755, 0, 0)
		checkStat(t, root, "srv/users/dev", os.ModeDir|0o700, 4242, 4242)
		if _, err := os.Lstat(filepath.Join(root, "etc/shadow")); !os.IsNotExist(err) {
			t.Errorf("shadow: %v, want it not made", err)
		}
	})
}

func TestProvisionExistingHome(t *testing.T) {
	root := debianRoot(t)
	if err := os.Mkdir(filepath.Join(root, "home/dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	rep, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Passwd != Created || rep.Home != Existed {
		t.Errorf("report %+v", rep)
	}
	if !hasNote(rep, "home /home/dev already exists, owned by 0:0: left as it is") {
		t.Errorf("notes %q", rep.Notes)
	}
	checkStat(t, root, "home/dev", os.ModeDir|0o755, 0, 0)
}

func TestProvisionShadowLineExists(t *testing.T) {
	root := debianRoot(t)
	writeFile(t, root, "etc/shadow", debianShadow+"dev:$6$x:1:::::", 0o640, 0, 42)
	rep, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Passwd != Created || rep.Shadow != Existed {
		t.Errorf("report %+v", rep)
	}
	if got := read(t, root, "etc/shadow"); got != debianShadow+"dev:$6$x:1:::::" {
		t.Errorf("shadow changed: %q", got)
	}
}

func TestProvisionNoTrailingNewline(t *testing.T) {
	root := debianRoot(t)
	writeFile(t, root, "etc/passwd", strings.TrimSuffix(debianPasswd, "\n"), 0o644, 0, 0)
	writeFile(t, root, "etc/shadow", strings.TrimSuffix(debianShadow, "\n"), 0o640, 0, 42)
	if _, err := provision(t, root, mustParse(t, "dev:4242:4242"), Options{}); err != nil {
		t.Fatal(err)
	}
	if got, want := read(t, root, "etc/passwd"), debianPasswd+"dev:x:4242:4242::/home/dev:/bin/sh\n"; got != want {
		t.Errorf("passwd %q, want %q", got, want)
	}
	if got := read(t, root, "etc/shadow"); !strings.HasPrefix(got, debianShadow+"dev:!:") {
		t.Errorf("shadow %q", got)
	}
}

func TestProvisionContext(t *testing.T) {
	root := debianRoot(t)
	u := mustParse(t, "dev:4242:4242")
	before := snapshot(t, root)

	lock <- struct{}{} // another provisioning holds the lock
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	start := time.Now()
	_, err := Provision(ctx, root, u, Options{})
	elapsed := time.Since(start)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	if elapsed > 2*time.Second {
		t.Errorf("returned after %v", elapsed)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Millisecond)
	_, err = Provision(ctx, root, u, Options{})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v, want context.DeadlineExceeded", err)
	}
	<-lock

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := Provision(ctx, root, u, Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled before: error %v, want context.Canceled", err)
	}
	if after := snapshot(t, root); after != before {
		t.Errorf("files changed:\n%s", after)
	}
	if _, err := provision(t, root, u, Options{}); err != nil {
		t.Errorf("after the lock was released: %v", err)
	}
}

func TestProvisionInvalid(t *testing.T) {
	root := t.TempDir()
	_, err := provision(t, root, User{Name: "dev", UID: 0, Home: "/home/dev", Shell: "/bin/sh"}, Options{})
	if err == nil || !strings.Contains(err.Error(), "uid 0 is root's") {
		t.Errorf("error %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc")); !os.IsNotExist(err) {
		t.Errorf("etc: %v, want nothing made", err)
	}
}

func TestVerifyFails(t *testing.T) {
	root := debianRoot(t)
	u := mustParse(t, "dev:4242:4242")
	p := &provisioner{u: u, rep: Report{Passwd: Created}}
	err := p.verify(root)
	if err == nil || !strings.HasPrefix(err.Error(), `provisioned dev:4242:4242:/home/dev:/bin/sh but a fresh lookup found none by name and none by uid`) {
		t.Errorf("error %v", err)
	}
	writeFile(t, root, "etc/passwd", debianPasswd+"dev:x:4242:4242::/home/dev:/bin/bash\n", 0o644, 0, 0)
	err = p.verify(root)
	if err == nil || !strings.Contains(err.Error(), `found "dev:4242:4242:/home/dev:/bin/bash" by name`) {
		t.Errorf("error %v", err)
	}
	p = &provisioner{u: mustParse(t, "dev:4243:4243"), rep: Report{Passwd: Existed}}
	if err := p.verify(root); err == nil {
		t.Errorf("an existing uid not found: no error")
	}
}
