//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	guestagent "github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/agent/reaper"
)

// newContainerHarness runs a guest agent with containers on this host,
// connected to a Client.
func newContainerHarness(t *testing.T, cfg guestagent.Config) *Client {
	t.Helper()
	agenttest.NeedContainers(t)
	host, guest := agenttest.SocketPair(t)
	// As PID 1 does: container processes are orphans adopted from
	// runc's pid files, and may exit before they are.
	r := reaper.New(reaper.Options{Orphans: true})
	cfg.System = &fakeSystem{powerOff: make(chan struct{})}
	cfg.Reaper = r
	cfg.StreamTimeout = 5 * time.Second
	cfg.OutputDrainIdle = 300 * time.Millisecond
	cfg = agenttest.Config(t, cfg)
	svc, err := guestagent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-registered first: the client goes, then the
	// session, then the reaper.
	t.Cleanup(r.Close)
	agenttest.Serve(t, svc, guest)
	c, err := Connect(context.Background(), host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var oneLayer = Rootfs{Layers: []Disk{{SCSIID: 1, FSType: "erofs", ReadOnly: true}}}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestClientContainer(t *testing.T) {
	c := newContainerHarness(t, guestagent.Config{})
	ctx := testCtx(t, time.Minute)
	var out, errOut agenttest.Buffer
	spec := agenttest.Spec(false, "sh", "-c", "read line; echo \"init got $line\"; echo bye >&2; exec sleep 1000")
	init, err := c.CreateContainer(ctx, ContainerCreate{
		ID: "web", ProcessID: "c1", Spec: mustJSON(t, spec), Rootfs: oneLayer,
		Stdin: strings.NewReader("hello\n"), Stdout: &out, Stderr: &errOut,
	})
	if err != nil {
		t.Fatal(err)
	}
	if init.ID() != "c1" || init.Pid() == 0 {
		t.Fatalf("init %s pid %d", init.ID(), init.Pid())
	}
	if err := c.StartContainer(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if err := c.StartContainer(ctx, "web"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("start twice: %v", err)
	}

	var execOut agenttest.Buffer
	p, err := c.ExecProcess(ctx, ExecCreate{
		ContainerID: "web", ProcessID: "c2",
		Process: mustJSON(t, &specs.Process{Args: []string{"sh", "-c", "cat; exit 4"}, Cwd: "/", Env: []string{"PATH=/bin"}}),
		Stdin:   strings.NewReader("via exec"), Stdout: &execOut,
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(ctx); err != nil || st.Code != 4 || execOut.String() != "via exec" {
		t.Fatalf("exec: %+v %v %q", st, err, execOut.String())
	}

	if err := c.PauseContainer(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if err := c.ResumeContainer(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateContainer(ctx, "web", mustJSON(t, &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: new(int64(100))}})); err != nil {
		t.Fatal(err)
	}
	m, err := c.ContainerStats(ctx, "web")
	if err != nil || m.CPU == nil {
		t.Fatalf("stats: %v %v", m, err)
	}
	pids, err := c.ContainerPids(ctx, "web")
	if err != nil || len(pids) == 0 {
		t.Fatalf("pids: %v %v", pids, err)
	}
	if err := c.DeleteContainer(ctx, "web"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete running: %v", err)
	}
	if _, _, err := waitExport(ctx, t, c, "web", "l2"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("export of a running container: %v", err)
	}
	if err := c.KillContainer(ctx, "web", syscall.SIGKILL, true); err != nil {
		t.Fatal(err)
	}
	st, err := init.Wait(ctx)
	if err != nil || st.Code != 137 || st.Signal != syscall.SIGKILL {
		t.Fatalf("init: %+v %v", st, err)
	}
	if out.String() != "init got hello\n" || errOut.String() != "bye\n" {
		t.Fatalf("init output %q %q", out.String(), errOut.String())
	}
	if err := c.KillContainer(ctx, "web", syscall.SIGKILL, false); !errdefs.IsNotFound(err) {
		t.Fatalf("kill stopped: %v", err)
	}
	// A stopped container's layer comes back (a directory root has no
	// write count: it always changed), then the container is deleted.
	if changed, entries, err := waitExport(ctx, t, c, "web", "l3"); err != nil || !changed || entries == 0 {
		t.Fatalf("export: %v %d %v", changed, entries, err)
	}
	if err := c.DeleteContainer(ctx, "web"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, _, err := waitExport(ctx, t, c, "web", "l4"); !errdefs.IsNotFound(err) {
		t.Fatalf("export after delete: %v", err)
	}
	if _, err := c.ContainerStats(ctx, "web"); !errdefs.IsNotFound(err) {
		t.Fatalf("stats after delete: %v", err)
	}
	if err := c.KillContainer(ctx, "web", 0, false); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("signal 0: %v", err)
	}
}

func TestClientContainerTerminal(t *testing.T) {
	c := newContainerHarness(t, guestagent.Config{})
	ctx := testCtx(t, time.Minute)
	spec := agenttest.Spec(true, "sh", "-c", "stty size")
	spec.Process.ConsoleSize = &specs.Box{Height: 33, Width: 77}
	if _, err := c.CreateContainer(ctx, ContainerCreate{ID: "tty", ProcessID: "t1", Spec: mustJSON(t, spec), Rootfs: oneLayer, Stderr: &agenttest.Buffer{}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("terminal with stderr: %v", err)
	}
	var out agenttest.Buffer
	init, err := c.CreateContainer(ctx, ContainerCreate{ID: "tty", ProcessID: "t1", Spec: mustJSON(t, spec), Rootfs: oneLayer, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartContainer(ctx, "tty"); err != nil {
		t.Fatal(err)
	}
	if st, err := init.Wait(ctx); err != nil || st.Code != 0 || !strings.Contains(out.String(), "33 77") {
		t.Fatalf("terminal: %+v %v %q", st, err, out.String())
	}
	if err := c.DeleteContainer(ctx, "tty"); err != nil {
		t.Fatal(err)
	}
}

// TestClientOOMEvent points the agent's cgroup root at a directory the
// test controls, so that an OOM kill can be staged in memory.events
// (this host may not run cgroup v2 with the memory controller). The event
// goes all the way: inotify in the agent, its queue, NextEvent over ttrpc.
func TestClientOOMEvent(t *testing.T) {
	cgroups := t.TempDir()
	c := newContainerHarness(t, guestagent.Config{CgroupRoot: cgroups})
	ctx := testCtx(t, time.Minute)
	cg := filepath.Join(cgroups, "cocoon", "hog")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	events := filepath.Join(cg, "memory.events")
	if err := os.WriteFile(events, []byte("oom 0\noom_kill 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateContainer(ctx, ContainerCreate{ID: "hog", ProcessID: "h1", Spec: mustJSON(t, agenttest.Spec(false, "true")), Rootfs: oneLayer}); err != nil {
		t.Fatal(err)
	}
	got := make(chan Event, 1)
	errc := make(chan error, 1)
	go func() {
		e, err := c.NextEvent(ctx)
		if err != nil {
			errc <- err
			return
		}
		got <- e
	}()
	time.Sleep(100 * time.Millisecond)
	if err := os.WriteFile(events, []byte("oom 1\noom_kill 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-got:
		if e.Kind != EventOOM || e.ContainerID != "hog" {
			t.Fatalf("event %+v", e)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no OOM event")
	}
	// A cancelled poll returns.
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.NextEvent(cctx); err == nil {
		t.Fatal("poll without events returned nothing")
	}
	if err := c.DeleteContainer(ctx, "hog"); err != nil {
		t.Fatal(err)
	}
}
