//go:build linux

package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	guestagent "github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/execuser"
)

var testUser = ExecUser{User: execuser.User{Name: "dev", UID: 4242, GID: 4242, Home: "/home/dev", Shell: "/bin/sh"}}

// runAs runs `sh -c script` in container id as uid and returns its
// stdout.
func runAs(t *testing.T, c *Client, id, pid string, uid uint32, script string) string {
	t.Helper()
	ctx := testCtx(t, time.Minute)
	var out agenttest.Buffer
	p, err := c.ExecProcess(ctx, ExecCreate{
		ContainerID: id, ProcessID: pid, Stdout: &out,
		Process: mustJSON(t, &specs.Process{Args: []string{"sh", "-c", script}, Cwd: "/", Env: []string{"PATH=/bin"},
			User: specs.User{UID: uid, GID: uid}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("%q as %d: %+v %v: %s", script, uid, st, err, out.String())
	}
	return out.String()
}

// The user is provisioned in the assembled root before the runtime's
// create, an exec as its uid gets its name and home, one as a uid with
// no entry runs with HOME=/ (as runc runs it), and a second provisioning
// finds it there.
func TestCreateContainerWithUser(t *testing.T) {
	c := newContainerHarness(t, guestagent.Config{})
	ctx := testCtx(t, time.Minute)
	var out agenttest.Buffer
	init, outcome, err := c.CreateContainerWithUser(ctx, ContainerCreate{
		ID: "u", ProcessID: "u1", Stdout: &out, Rootfs: oneLayer,
		Spec: mustJSON(t, agenttest.Spec(false, "sh", "-c", `echo "init HOME=$HOME"; exec sleep 1000`)),
	}, &UserProvision{ExecUser: testUser, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if outcome.Err != nil || outcome.Report == nil {
		t.Fatalf("outcome %+v", outcome)
	}
	if r := outcome.Report; r.Passwd != "created" || r.Group != "created" || r.Home != "created" || r.Shadow != "absent" ||
		r.ByName != "dev:x:4242:4242::/home/dev:/bin/sh" || r.ByUID != r.ByName {
		t.Errorf("report %+v", *r)
	}
	if err := c.StartContainer(ctx, "u"); err != nil {
		t.Fatal(err)
	}
	if got := runAs(t, c, "u", "u2", 4242, `echo "$HOME $(id -un)"`); got != "/home/dev dev\n" {
		t.Errorf("as 4242: %q", got)
	}
	if got := runAs(t, c, "u", "u3", 4243, `echo "$HOME"; grep -c 4243 /etc/passwd || true`); got != "/\n0\n" {
		t.Errorf("as the unknown uid 4243: %q, want HOME=/ and no entry", got)
	}
	r, err := c.ProvisionUser(ctx, "u", testUser)
	if err != nil || r.Passwd != "existed" || r.Home != "existed" {
		t.Errorf("again: %+v %v", r, err)
	}
	if got := runAs(t, c, "u", "u4", 0, "grep -c ^dev: /etc/passwd /etc/group"); got != "/etc/passwd:1\n/etc/group:1\n" {
		t.Errorf("entries: %q", got)
	}
	if err := c.KillContainer(ctx, "u", 9, false); err != nil {
		t.Fatal(err)
	}
	if _, err := init.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ProvisionUser(ctx, "u", testUser); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("provisioning a stopped container: %v, want a failed precondition", err)
	}
	if !strings.HasPrefix(out.String(), "init HOME=") {
		t.Errorf("init output %q", out.String())
	}
}

// A user the image's entries conflict with: a required one fails the
// create and leaves no container; one not required is reported, with no
// retry to be made, and the create goes on.
func TestCreateContainerWithUserConflict(t *testing.T) {
	c := newContainerHarness(t, guestagent.Config{})
	ctx := testCtx(t, time.Minute)
	root := ExecUser{User: execuser.User{Name: "root", UID: 4242, GID: 4242, Home: "/root", Shell: "/bin/sh"}}
	spec := mustJSON(t, agenttest.Spec(false, "true"))
	_, _, err := c.CreateContainerWithUser(ctx, ContainerCreate{ID: "bad", ProcessID: "b1", Spec: spec, Rootfs: oneLayer},
		&UserProvision{ExecUser: root, Timeout: 5 * time.Second, Required: true})
	if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "root") {
		t.Fatalf("required conflicting user: %v, want an already-exists error naming root", err)
	}
	if err := c.StartContainer(ctx, "bad"); !errdefs.IsNotFound(err) {
		t.Errorf("the failed create left a container: %v", err)
	}
	_, outcome, err := c.CreateContainerWithUser(ctx, ContainerCreate{ID: "bad", ProcessID: "b2", Spec: spec, Rootfs: oneLayer},
		&UserProvision{ExecUser: root, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if outcome.Err == nil || outcome.Retry || outcome.Report != nil {
		t.Errorf("outcome %+v, want the conflict and no retry", outcome)
	}
	if err := c.DeleteContainer(ctx, "bad"); err != nil {
		t.Fatal(err)
	}
}

// A guest that claims what it did not do is caught.
func TestCheckUserReport(t *testing.T) {
	u := testUser.User
	good := "dev:x:4242:4242::/home/dev:/bin/sh"
	for _, tc := range []struct {
		name string
		r    UserReport
		ok   bool
	}{
		{"created", UserReport{Passwd: "created", ByName: good, ByUID: good}, true},
		{"existed under another name", UserReport{Passwd: "existed", ByUID: "alice:x:4242:100::/home/alice:/bin/bash"}, true},
		{"created, but not found", UserReport{Passwd: "created"}, false},
		{"created, another home", UserReport{Passwd: "created", ByName: "dev:x:4242:4242::/:/bin/sh", ByUID: good}, false},
		{"existed, another uid", UserReport{Passwd: "existed", ByUID: "alice:x:1000:100::/home/alice:/bin/bash"}, false},
		{"existed, malformed", UserReport{Passwd: "existed", ByUID: "4242"}, false},
		{"an unknown status", UserReport{Passwd: "done", ByName: good, ByUID: good}, false},
	} {
		err := CheckUserReport(u, tc.r)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
