//go:build linux

package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/agent/reaper"
	"github.com/cocoonrt/cocoon/guest/api"
)

type quietSystem struct{}

func (quietSystem) SetWallClock(time.Time) error { return nil }
func (quietSystem) AddEntropy([]byte) error      { return nil }
func (quietSystem) SetHostname(string) error     { return nil }
func (quietSystem) PowerOff() error              { return nil }

// containerService is an agent with containers on this host, served over
// a socket pair so that stdio goes through real streams.
type containerService struct {
	*agent.Service
	cfg  agent.Config
	sess *hostSession
}

func newContainerService(t *testing.T, cfg agent.Config) *containerService {
	t.Helper()
	agenttest.NeedContainers(t)
	// As PID 1 does: container processes are orphans adopted from
	// the runtime's pid files, and may exit before they are.
	r := reaper.New(reaper.Options{Orphans: true})
	t.Cleanup(r.Close)
	cfg.System, cfg.Reaper = quietSystem{}, r
	if cfg.StreamTimeout == 0 {
		cfg.StreamTimeout = 5 * time.Second
	}
	if cfg.OutputDrainIdle == 0 {
		cfg.OutputDrainIdle = 300 * time.Millisecond
	}
	cfg = agenttest.Config(t, cfg)
	s, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cs := &containerService{Service: s, cfg: cfg}
	cs.sess = newHostSession(t, s)
	t.Cleanup(func() { cleanupContainers(t, cfg) })
	return cs
}

// cleanupContainers removes what a failed test left in the OCI runtime.
func cleanupContainers(t *testing.T, cfg agent.Config) {
	entries, _ := os.ReadDir(cfg.RuntimeRoot)
	for _, e := range entries {
		t.Logf("left over container %s: deleting", e.Name())
		_ = runtimeForce(cfg, e.Name())
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func specJSON(t *testing.T, s *specs.Spec) []byte {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var oneLayer = &api.Rootfs{Layers: []*api.Disk{{ScsiId: 1, Fstype: "erofs", ReadOnly: true}}}

// proc is a container process's stdio as the host sees it.
type proc struct {
	id     string
	stdin  net.Conn
	stdout syncBuf
	stderr syncBuf
	copied sync.WaitGroup
}

type syncBuf struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// open opens the stdio streams of process id on the session.
func (cs *containerService) open(t *testing.T, id string, stdin, stdout, stderr bool) *proc {
	t.Helper()
	p := &proc{id: id}
	if stdin {
		p.stdin = cs.sess.open(t, api.StreamStdin, id)
	}
	for _, o := range []struct {
		want bool
		kind api.StreamKind
		buf  *syncBuf
	}{{stdout, api.StreamStdout, &p.stdout}, {stderr, api.StreamStderr, &p.stderr}} {
		if !o.want {
			continue
		}
		c := cs.sess.open(t, o.kind, id)
		p.copied.Add(1)
		go func() {
			defer p.copied.Done()
			_, _ = io.Copy(o.buf, c)
		}()
	}
	return p
}

func (cs *containerService) wait(t *testing.T, p *proc) *api.WaitProcessResponse {
	t.Helper()
	resp, err := cs.WaitProcess(ctxFor(t, 30*time.Second), &api.WaitProcessRequest{Id: p.id})
	if err != nil {
		t.Fatalf("wait %s: %v", p.id, err)
	}
	p.copied.Wait()
	return resp
}

func (cs *containerService) create(t *testing.T, cid, pid string, spec *specs.Spec, stdin, stdout, stderr bool) *proc {
	t.Helper()
	p := cs.open(t, pid, stdin, stdout, stderr)
	resp, err := cs.CreateContainer(ctxFor(t, 30*time.Second), &api.CreateContainerRequest{
		ContainerId: cid, ProcessId: pid, Spec: specJSON(t, spec), Rootfs: oneLayer,
		Stdin: stdin, Stdout: stdout, Stderr: stderr,
	})
	if err != nil {
		t.Fatalf("create %s: %v", cid, err)
	}
	if resp.Pid == 0 {
		t.Fatal("no pid")
	}
	return p
}

func (cs *containerService) exec(t *testing.T, cid, pid string, process *specs.Process, stdin, stdout, stderr bool) (*proc, error) {
	t.Helper()
	p := cs.open(t, pid, stdin, stdout, stderr)
	b, err := json.Marshal(process)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.ExecProcess(ctxFor(t, 30*time.Second), &api.ExecProcessRequest{
		ContainerId: cid, ProcessId: pid, Process: b, Stdin: stdin, Stdout: stdout, Stderr: stderr,
	})
	return p, err
}

func execSpec(args ...string) *specs.Process {
	return &specs.Process{Args: args, Env: []string{"PATH=/bin"}, Cwd: "/"}
}

func req(cid string) *api.ContainerRequest { return &api.ContainerRequest{ContainerId: cid} }

func TestContainerLifecycle(t *testing.T) {
	cs := newContainerService(t, agent.Config{})
	ctx := ctxFor(t, 2*time.Minute)
	spec := agenttest.Spec(false, "sh", "-c", "echo out; echo err >&2; exec sleep 1000")
	initP := cs.create(t, "life", "life-init", spec, false, true, true)

	pids, err := cs.ContainerPids(ctx, req("life"))
	if err != nil || len(pids.Pids) != 1 {
		t.Fatalf("pids of a created container: %v %v", pids, err)
	}
	if _, err := cs.StartContainer(ctx, req("life")); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.StartContainer(ctx, req("life")); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "only a created container can be started") {
		t.Fatalf("start twice: %v", err)
	}

	// Exec: output, exit code, stdin.
	p, err := cs.exec(t, "life", "e1", execSpec("echo", "hello"), false, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if st := cs.wait(t, p); st.ExitStatus != 0 || p.stdout.String() != "hello\n" {
		t.Fatalf("echo: %v %q", st, p.stdout.String())
	}
	p, err = cs.exec(t, "life", "e2", execSpec("sh", "-c", "exit 5"), false, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if st := cs.wait(t, p); st.ExitStatus != 5 {
		t.Fatalf("exit 5: %v", st)
	}
	p, err = cs.exec(t, "life", "e3", execSpec("cat"), true, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.stdin.Write([]byte("from stdin")); err != nil {
		t.Fatal(err)
	}
	// The half-close is the EOF. (CloseStdin is not called: in this
	// test it would not travel behind the data on the session.)
	_ = p.stdin.Close()
	if st := cs.wait(t, p); st.ExitStatus != 0 || p.stdout.String() != "from stdin" {
		t.Fatalf("cat: %v %q", st, p.stdout.String())
	}
	if _, err := cs.exec(t, "life", "e4", execSpec("/nonexistent"), false, false, false); err == nil {
		t.Fatal("exec of a missing program succeeded")
	}

	// Pause and resume.
	if _, err := cs.PauseContainer(ctx, req("life")); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.PauseContainer(ctx, req("life")); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("pause twice: %v", err)
	}
	if _, err := cs.exec(t, "life", "e5", execSpec("true"), false, false, false); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("exec in a paused container: %v", err)
	}
	if _, err := cs.DeleteContainer(ctx, req("life")); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete a paused container: %v", err)
	}
	if _, err := cs.ResumeContainer(ctx, req("life")); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ResumeContainer(ctx, req("life")); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("resume a running container: %v", err)
	}

	// Update, stats, pids.
	limit := int64(64)
	res, _ := json.Marshal(&specs.LinuxResources{Pids: &specs.LinuxPids{Limit: &limit}})
	if _, err := cs.UpdateContainer(ctx, &api.UpdateContainerRequest{ContainerId: "life", Resources: res}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.UpdateContainer(ctx, &api.UpdateContainerRequest{ContainerId: "life", Resources: []byte("{")}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("update with bad json: %v", err)
	}
	sr, err := cs.ContainerStats(ctx, req("life"))
	if err != nil {
		t.Fatal(err)
	}
	var m stats.Metrics
	if err := proto.Unmarshal(sr.Metrics, &m); err != nil {
		t.Fatal(err)
	}
	if m.CPU == nil || m.Memory == nil || m.Pids == nil {
		t.Fatalf("metrics incomplete: %v", &m)
	}
	if agenttest.Unified() && (m.Pids.Current == 0 || m.Pids.Limit != uint64(limit) || m.Memory.Usage == 0) {
		t.Fatalf("metrics: %v", &m)
	}
	pids, err = cs.ContainerPids(ctx, req("life"))
	if err != nil || len(pids.Pids) == 0 {
		t.Fatalf("pids: %v %v", pids, err)
	}

	// Delete needs it stopped; kill it.
	if _, err := cs.DeleteContainer(ctx, req("life")); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "is running") {
		t.Fatalf("delete a running container: %v", err)
	}
	if _, err := cs.KillContainer(ctx, &api.KillContainerRequest{ContainerId: "life", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	st := cs.wait(t, initP)
	if st.ExitStatus != 137 || st.Signal != 9 {
		t.Fatalf("init: %v", st)
	}
	if initP.stdout.String() != "out\n" || initP.stderr.String() != "err\n" {
		t.Fatalf("init output %q %q", initP.stdout.String(), initP.stderr.String())
	}
	if _, err := cs.KillContainer(ctx, &api.KillContainerRequest{ContainerId: "life", Signal: 9}); !errdefs.IsNotFound(err) {
		t.Fatalf("kill a stopped container: %v", err)
	}
	if _, err := cs.StartContainer(ctx, req("life")); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "is stopped") {
		t.Fatalf("start a stopped container: %v", err)
	}
	if _, err := cs.UpdateContainer(ctx, &api.UpdateContainerRequest{ContainerId: "life", Resources: res}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("update a stopped container: %v", err)
	}
	if _, err := cs.DeleteContainer(ctx, req("life")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cs.cfg.ContainerDir, "life")); !os.IsNotExist(err) {
		t.Fatalf("container directory left: %v", err)
	}
	for name, err := range map[string]error{
		"delete": second(cs.DeleteContainer(ctx, req("life"))),
		"stats":  second(cs.ContainerStats(ctx, req("life"))),
		"pids":   second(cs.ContainerPids(ctx, req("life"))),
		"pause":  second(cs.PauseContainer(ctx, req("life"))),
	} {
		if !errdefs.IsNotFound(err) {
			t.Errorf("%s after delete: want not found, got %v", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }

func TestContainerExitStatusAfterOutput(t *testing.T) {
	cs := newContainerService(t, agent.Config{})
	ctx := ctxFor(t, time.Minute)
	spec := agenttest.Spec(false, "sh", "-c", `i=0; while [ $i -lt 2000 ]; do echo line$i; i=$((i+1)); done; exit 7`)
	p := cs.create(t, "count", "count-init", spec, false, true, false)
	if _, err := cs.StartContainer(ctx, req("count")); err != nil {
		t.Fatal(err)
	}
	st := cs.wait(t, p)
	if st.ExitStatus != 7 {
		t.Fatalf("exit %v", st)
	}
	out := p.stdout.String()
	if n := strings.Count(out, "\n"); n != 2000 || !strings.HasSuffix(out, "line1999\n") {
		t.Fatalf("%d lines before the exit was visible", n)
	}
	if _, err := cs.DeleteContainer(ctx, req("count")); err != nil {
		t.Fatal(err)
	}
}

func TestContainerTerminal(t *testing.T) {
	cs := newContainerService(t, agent.Config{})
	ctx := ctxFor(t, time.Minute)
	spec := agenttest.Spec(true, "sh", "-c", `stty size; read x; stty size`)
	spec.Process.ConsoleSize = &specs.Box{Height: 40, Width: 100}
	p := cs.create(t, "tty", "tty-init", spec, true, true, false)
	if _, err := cs.StartContainer(ctx, req("tty")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(p.stdout.String(), "40 100") })
	if _, err := cs.ResizePty(ctx, &api.ResizePtyRequest{Id: "tty-init", Width: 132, Height: 50}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.stdin.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	if st := cs.wait(t, p); st.ExitStatus != 0 || !strings.Contains(p.stdout.String(), "50 132") {
		t.Fatalf("terminal: %v %q", st, p.stdout.String())
	}

	// A terminal exec in a running container.
	spec = agenttest.Spec(false, "sleep", "1000")
	cs.create(t, "tty2", "tty2-init", spec, false, false, false)
	if _, err := cs.StartContainer(ctx, req("tty2")); err != nil {
		t.Fatal(err)
	}
	ep := execSpec("sh", "-c", "stty size; test -t 0 && echo is-a-tty")
	ep.Terminal = true
	ep.ConsoleSize = &specs.Box{Height: 24, Width: 80}
	e, err := cs.exec(t, "tty2", "tty2-exec", ep, false, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if st := cs.wait(t, e); st.ExitStatus != 0 || !strings.Contains(e.stdout.String(), "24 80") || !strings.Contains(e.stdout.String(), "is-a-tty") {
		t.Fatalf("terminal exec: %v %q", st, e.stdout.String())
	}
	if _, err := cs.exec(t, "tty2", "tty2-bad", ep, false, true, true); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("terminal exec with stderr: %v", err)
	}
	if _, err := cs.KillContainer(ctx, &api.KillContainerRequest{ContainerId: "tty2", Signal: 9, All: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.WaitProcess(ctx, &api.WaitProcessRequest{Id: "tty2-init"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"tty", "tty2"} {
		if _, err := cs.DeleteContainer(ctx, req(id)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestContainerDeleteCreated(t *testing.T) {
	cs := newContainerService(t, agent.Config{})
	ctx := ctxFor(t, time.Minute)
	p := cs.create(t, "never", "never-init", agenttest.Spec(false, "true"), false, false, false)
	if _, err := cs.DeleteContainer(ctx, req("never")); err != nil {
		t.Fatal(err)
	}
	if st := cs.wait(t, p); st.ExitStatus != 137 {
		t.Fatalf("init of a deleted created container: %v", st)
	}
	// The id is free again.
	p = cs.create(t, "never", "never-init2", agenttest.Spec(false, "sh", "-c", "exit 0"), false, false, false)
	if _, err := cs.StartContainer(ctx, req("never")); err != nil {
		t.Fatal(err)
	}
	if st := cs.wait(t, p); st.ExitStatus != 0 {
		t.Fatalf("second container: %v", st)
	}
	if _, err := cs.DeleteContainer(ctx, req("never")); err != nil {
		t.Fatal(err)
	}
}

func TestContainerCreateFailureUnwinds(t *testing.T) {
	cs := newContainerService(t, agent.Config{})
	ctx := ctxFor(t, time.Minute)
	bad := agenttest.Spec(false, "true")
	bad.Mounts = append(bad.Mounts, specs.Mount{Destination: "/x", Type: "nosuchfs", Source: "none"})
	p := cs.open(t, "bad-init", false, true, false)
	_, err := cs.CreateContainer(ctx, &api.CreateContainerRequest{
		ContainerId: "bad", ProcessId: "bad-init", Spec: specJSON(t, bad), Rootfs: oneLayer, Stdout: true,
	})
	if err == nil || !strings.Contains(err.Error(), " create: ") {
		t.Fatalf("create with an impossible mount: %v", err)
	}
	p.copied.Wait() // the stream was closed
	if _, err := os.Stat(filepath.Join(cs.cfg.ContainerDir, "bad")); !os.IsNotExist(err) {
		t.Fatalf("container directory left: %v", err)
	}
	// Both ids are free again.
	good := cs.create(t, "bad", "bad-init", agenttest.Spec(false, "true"), false, false, false)
	if _, err := cs.StartContainer(ctx, req("bad")); err != nil {
		t.Fatal(err)
	}
	cs.wait(t, good)
	if _, err := cs.DeleteContainer(ctx, req("bad")); err != nil {
		t.Fatal(err)
	}
}

func TestContainerValidation(t *testing.T) {
	cs := newContainerService(t, agent.Config{MaxContainers: 1})
	ctx := ctxFor(t, time.Minute)
	good := specJSON(t, agenttest.Spec(false, "true"))
	tty := agenttest.Spec(true, "true")
	systemd := agenttest.Spec(false, "true")
	systemd.Linux.CgroupsPath = "system.slice:cri:abc"
	noProcess := agenttest.Spec(false)
	for name, r := range map[string]*api.CreateContainerRequest{
		"bad id":             {ContainerId: "-x", ProcessId: "p", Spec: good, Rootfs: oneLayer},
		"long id":            {ContainerId: strings.Repeat("a", 77), ProcessId: "p", Spec: good, Rootfs: oneLayer},
		"bad process id":     {ContainerId: "c", ProcessId: "a/b", Spec: good, Rootfs: oneLayer},
		"no rootfs":          {ContainerId: "c", ProcessId: "p", Spec: good},
		"spec too large":     {ContainerId: "c", ProcessId: "p", Spec: make([]byte, agent.MaxSpecSize+1), Rootfs: oneLayer},
		"spec not json":      {ContainerId: "c", ProcessId: "p", Spec: []byte("{"), Rootfs: oneLayer},
		"no process":         {ContainerId: "c", ProcessId: "p", Spec: specJSON(t, noProcess), Rootfs: oneLayer},
		"tty with stderr":    {ContainerId: "c", ProcessId: "p", Spec: specJSON(t, tty), Rootfs: oneLayer, Stderr: true},
		"systemd cgroupPath": {ContainerId: "c", ProcessId: "p", Spec: specJSON(t, systemd), Rootfs: oneLayer},
	} {
		if _, err := cs.CreateContainer(ctx, r); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: want invalid argument, got %v", name, err)
		}
	}
	for name, err := range map[string]error{
		"start":  second(cs.StartContainer(ctx, req("nope"))),
		"kill":   second(cs.KillContainer(ctx, &api.KillContainerRequest{ContainerId: "nope", Signal: 15})),
		"delete": second(cs.DeleteContainer(ctx, req("nope"))),
		"resume": second(cs.ResumeContainer(ctx, req("nope"))),
		"update": second(cs.UpdateContainer(ctx, &api.UpdateContainerRequest{ContainerId: "nope", Resources: []byte("{}")})),
		"exec":   second(cs.ExecProcess(ctx, &api.ExecProcessRequest{ContainerId: "nope", ProcessId: "x", Process: []byte(`{"args":["true"]}`)})),
	} {
		if !errdefs.IsNotFound(err) {
			t.Errorf("%s of an unknown container: want not found, got %v", name, err)
		}
	}
	if _, err := cs.KillContainer(ctx, &api.KillContainerRequest{ContainerId: "nope", Signal: 0}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("signal 0: %v", err)
	}

	cs.create(t, "one", "one-init", agenttest.Spec(false, "true"), false, false, false)
	if _, err := cs.CreateContainer(ctx, &api.CreateContainerRequest{ContainerId: "one", ProcessId: "p2", Spec: good, Rootfs: oneLayer}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("same id twice: %v", err)
	}
	if _, err := cs.CreateContainer(ctx, &api.CreateContainerRequest{ContainerId: "two", ProcessId: "p3", Spec: good, Rootfs: oneLayer}); !errdefs.IsResourceExhausted(err) {
		t.Errorf("over MaxContainers: %v", err)
	}
	if _, err := cs.ExecProcess(ctx, &api.ExecProcessRequest{ContainerId: "one", ProcessId: "x", Process: []byte(`{"args":[]}`)}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("exec without args: %v", err)
	}
	if _, err := cs.ExecProcess(ctx, &api.ExecProcessRequest{ContainerId: "one", ProcessId: "x", Process: []byte(`{"args":["true"]}`)}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "is created") {
		t.Errorf("exec in a created container: %v", err)
	}
	if _, err := cs.DeleteContainer(ctx, req("one")); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestContainerOOM runs a container into its memory limit; it needs a
// host with cgroup v2 and the memory controller, as the guest has.
func TestContainerOOM(t *testing.T) {
	if !agenttest.Unified() {
		t.Skip("needs a cgroup v2 host with the memory controller (the guest's setup)")
	}
	cs := newContainerService(t, agent.Config{})
	ctx := ctxFor(t, time.Minute)
	spec := agenttest.Spec(false, "tail", "/dev/zero")
	limit := int64(16 << 20)
	spec.Linux.Resources = &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit, Swap: &limit}}
	p := cs.create(t, "oom", "oom-init", spec, false, false, false)
	if _, err := cs.StartContainer(ctx, req("oom")); err != nil {
		t.Fatal(err)
	}
	// The exit carries the OOM kill, so that the host can report it
	// before the exit even when the event comes later.
	if st := cs.wait(t, p); st.ExitStatus != 137 || st.OomKills == 0 {
		t.Fatalf("exit %v, want 137 with the OOM kill counted", st)
	}
	ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e, err := cs.NextEvent(ectx, &api.NextEventRequest{})
	if err != nil || e.Kind != api.Event_OOM || e.ContainerId != "oom" || e.OomKills == 0 {
		t.Fatalf("event %v %v", e, err)
	}
	if _, err := cs.DeleteContainer(ctx, req("oom")); err != nil {
		t.Fatal(err)
	}
}

// TestContainersConcurrently creates containers and runs short execs in
// parallel: execs that exit before the runtime has returned must still report.
func TestContainersConcurrently(t *testing.T) {
	cs := newContainerService(t, agent.Config{})
	ctx := ctxFor(t, 2*time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cid := fmt.Sprintf("par%d", i)
			init := cs.open(t, cid+"-init", false, false, false)
			if _, err := cs.CreateContainer(ctx, &api.CreateContainerRequest{ContainerId: cid, ProcessId: cid + "-init",
				Spec: specJSON(t, agenttest.Spec(false, "sleep", "1000")), Rootfs: oneLayer}); err != nil {
				errs <- err
				return
			}
			if _, err := cs.StartContainer(ctx, req(cid)); err != nil {
				errs <- err
				return
			}
			var execs sync.WaitGroup
			for j := range 5 {
				execs.Add(1)
				go func() {
					defer execs.Done()
					pid := fmt.Sprintf("%s-e%d", cid, j)
					p, err := cs.exec(t, cid, pid, execSpec("sh", "-c", fmt.Sprintf("echo %s; exit %d", pid, j)), false, true, false)
					if err != nil {
						errs <- err
						return
					}
					resp, err := cs.WaitProcess(ctx, &api.WaitProcessRequest{Id: pid})
					p.copied.Wait()
					if err != nil || resp.ExitStatus != uint32(j) || p.stdout.String() != pid+"\n" {
						errs <- fmt.Errorf("%s: %v %v %q", pid, resp, err, p.stdout.String())
					}
				}()
			}
			execs.Wait()
			if _, err := cs.KillContainer(ctx, &api.KillContainerRequest{ContainerId: cid, Signal: 9}); err != nil {
				errs <- err
				return
			}
			if _, err := cs.WaitProcess(ctx, &api.WaitProcessRequest{Id: init.id}); err != nil {
				errs <- err
				return
			}
			if _, err := cs.DeleteContainer(ctx, req(cid)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
