package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/agent"
)

// testService is a Service on a fake sandbox, with what the test checks.
type testService struct {
	t        *testing.T
	svc      *Service
	launcher *fakeLauncher
	events   *recorder
	// shutdowns counts the calls of Options.Shutdown.
	shutdowns atomic.Int32
}

func newTestService(t *testing.T) *testService {
	t.Helper()
	ts := &testService{t: t, launcher: &fakeLauncher{}, events: &recorder{}}
	ts.svc = New(Options{
		Namespace:     "ns",
		Launcher:      ts.launcher,
		Publisher:     ts.events,
		Shutdown:      func() { ts.shutdowns.Add(1) },
		ExecExitGrace: time.Second,
	})
	t.Cleanup(func() { _ = ts.svc.Close(context.Background()) })
	return ts
}

// bundle writes a bundle with an OCI spec carrying annotations.
func (ts *testService) bundle(annotations map[string]string) string {
	ts.t.Helper()
	dir := ts.t.TempDir()
	spec := specs.Spec{
		Version:     specs.Version,
		Process:     &specs.Process{Args: []string{"sh"}, Cwd: "/"},
		Root:        &specs.Root{Path: "rootfs"},
		Annotations: annotations,
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
			{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace},
		}},
	}
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		ts.t.Fatal(err)
	}
	return dir
}

func (ts *testService) create(id string, annotations map[string]string) (*taskapi.CreateTaskResponse, error) {
	return ts.svc.Create(context.Background(), &taskapi.CreateTaskRequest{ID: id, Bundle: ts.bundle(annotations)})
}

func (ts *testService) mustCreateStart(id string) *fakeProcess {
	ts.t.Helper()
	if _, err := ts.create(id, nil); err != nil {
		ts.t.Fatalf("create %s: %v", id, err)
	}
	if _, err := ts.svc.Start(context.Background(), &taskapi.StartRequest{ID: id}); err != nil {
		ts.t.Fatalf("start %s: %v", id, err)
	}
	return ts.launcher.sandbox(0).proc(id)
}

func (ts *testService) wait(id, execID string) *taskapi.WaitResponse {
	ts.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := ts.svc.Wait(ctx, &taskapi.WaitRequest{ID: id, ExecID: execID})
	if err != nil {
		ts.t.Fatalf("wait %s %s: %v", id, execID, err)
	}
	return r
}

func (ts *testService) state(id, execID string) tasktypes.Status {
	ts.t.Helper()
	r, err := ts.svc.State(context.Background(), &taskapi.StateRequest{ID: id, ExecID: execID})
	if err != nil {
		ts.t.Fatalf("state %s %s: %v", id, execID, err)
	}
	return r.Status
}

// wantErr fails t unless err is of the errdefs class is checks.
func wantErr(t *testing.T, err error, is func(error) bool, what string) {
	t.Helper()
	if err == nil || !is(err) {
		t.Fatalf("%s: got error %v, want another class of error", what, err)
	}
}

// TestLifecycle runs a container through create, start, exit, delete and
// holds the events to containerd's order.
func TestLifecycle(t *testing.T) {
	ts := newTestService(t)
	resp, err := ts.create("c1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Pid != fakeHostPID {
		t.Errorf("create pid = %d, want the VMM's %d", resp.Pid, fakeHostPID)
	}
	if got := ts.state("c1", ""); got != tasktypes.Status_CREATED {
		t.Errorf("state after create = %v", got)
	}
	if _, err := ts.svc.Start(context.Background(), &taskapi.StartRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if got := ts.state("c1", ""); got != tasktypes.Status_RUNNING {
		t.Errorf("state after start = %v", got)
	}
	ts.launcher.sandbox(0).proc("c1").exit(3)
	if w := ts.wait("c1", ""); w.ExitStatus != 3 || w.ExitedAt == nil {
		t.Errorf("wait = %v", w)
	}
	if got := ts.state("c1", ""); got != tasktypes.Status_STOPPED {
		t.Errorf("state after exit = %v", got)
	}
	d, err := ts.svc.Delete(context.Background(), &taskapi.DeleteRequest{ID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if d.ExitStatus != 3 || d.Pid != fakeHostPID {
		t.Errorf("delete = %v", d)
	}
	want := []string{TopicCreate, TopicStart, TopicExit, TopicDelete}
	if got := ts.events.topics(); !reflect.DeepEqual(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
	exit := ts.events.find(TopicExit)[0].(*eventstypes.TaskExit)
	if exit.ContainerID != "c1" || exit.ID != "c1" || exit.ExitStatus != 3 || exit.Pid != fakeHostPID {
		t.Errorf("exit event = %v", exit)
	}
	if !ts.launcher.sandbox(0).isStopped() {
		t.Error("the VM still runs after its last container was deleted")
	}
	_, err = ts.svc.State(context.Background(), &taskapi.StateRequest{ID: "c1"})
	wantErr(t, err, errdefs.IsNotFound, "state after delete")
	if _, err := ts.svc.Shutdown(context.Background(), &taskapi.ShutdownRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if ts.shutdowns.Load() != 1 {
		t.Error("Shutdown with no container left did not end the shim")
	}
}

// TestShutdownWhileBusy keeps the shim while a container remains.
func TestShutdownWhileBusy(t *testing.T) {
	ts := newTestService(t)
	ts.mustCreateStart("c1")
	if _, err := ts.svc.Shutdown(context.Background(), &taskapi.ShutdownRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if ts.shutdowns.Load() != 0 {
		t.Error("Shutdown ended the shim while a container remains")
	}
}

// TestIllegalTransitions checks that what the lifecycle forbids fails with
// the errdefs class containerd and CRI rely on, and a sentence.
func TestIllegalTransitions(t *testing.T) {
	ts := newTestService(t)
	ctx := context.Background()
	if _, err := ts.create("c1", nil); err != nil {
		t.Fatal(err)
	}
	_, err := ts.svc.Pause(ctx, &taskapi.PauseRequest{ID: "c1"})
	wantErr(t, err, errdefs.IsFailedPrecondition, "pause a created container")
	if !strings.Contains(err.Error(), "cannot pause container c1: it is created") {
		t.Errorf("pause error %q does not say why", err)
	}
	_, err = ts.svc.Exec(ctx, &taskapi.ExecProcessRequest{ID: "c1", ExecID: "e1", Spec: processSpec(t, "true")})
	wantErr(t, err, errdefs.IsFailedPrecondition, "exec in a created container")
	_, err = ts.create("c1", nil)
	wantErr(t, err, errdefs.IsAlreadyExists, "create twice")

	if _, err := ts.svc.Start(ctx, &taskapi.StartRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	_, err = ts.svc.Start(ctx, &taskapi.StartRequest{ID: "c1"})
	wantErr(t, err, errdefs.IsFailedPrecondition, "start twice")
	_, err = ts.svc.Resume(ctx, &taskapi.ResumeRequest{ID: "c1"})
	wantErr(t, err, errdefs.IsFailedPrecondition, "resume a running container")
	_, err = ts.svc.Delete(ctx, &taskapi.DeleteRequest{ID: "c1"})
	wantErr(t, err, errdefs.IsFailedPrecondition, "delete a running container")
	if !strings.Contains(err.Error(), "kill it") {
		t.Errorf("delete error %q does not say what to do", err)
	}

	ts.launcher.sandbox(0).proc("c1").exit(0)
	ts.wait("c1", "")
	_, err = ts.svc.Kill(ctx, &taskapi.KillRequest{ID: "c1", Signal: 15})
	wantErr(t, err, errdefs.IsNotFound, "kill a stopped container")
	_, err = ts.svc.Start(ctx, &taskapi.StartRequest{ID: "c1"})
	wantErr(t, err, errdefs.IsFailedPrecondition, "start a stopped container")
	_, err = ts.svc.Kill(ctx, &taskapi.KillRequest{ID: "nope", Signal: 15})
	wantErr(t, err, errdefs.IsNotFound, "kill an unknown container")
	_, err = ts.svc.Kill(ctx, &taskapi.KillRequest{ID: "c1", Signal: 0})
	wantErr(t, err, errdefs.IsInvalidArgument, "signal 0")
}

// TestStateTable checks the whole transition table in one place.
func TestStateTable(t *testing.T) {
	for _, tc := range []struct {
		from state
		op   op
		ok   bool
	}{
		{stateCreated, opStart, true},
		{stateRunning, opStart, false},
		{stateRunning, opPause, true},
		{statePaused, opPause, false},
		{statePaused, opResume, true},
		{stateRunning, opResume, false},
		{stateStopped, opDelete, true},
		{stateCreated, opDelete, true},
		{stateRunning, opDelete, false},
		{statePaused, opKill, true},
		{stateStopped, opKill, false},
		{stateDeleted, opKill, false},
		{stateRunning, opExit, true},
		{stateStopped, opExit, false},
		{stateRunning, opExec, true},
		{stateCreated, opExec, false},
	} {
		err := tc.from.check(tc.op, "container c")
		if (err == nil) != tc.ok {
			t.Errorf("%s in state %s: err = %v, want ok=%v", tc.op, tc.from, err, tc.ok)
		}
	}
}

func processSpec(t *testing.T, args ...string) *anypb.Any {
	t.Helper()
	data, err := json.Marshal(specs.Process{Args: args, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	return &anypb.Any{TypeUrl: processSpecURL, Value: data}
}

// TestExecAndInitExitOrder runs an exec, then ends the init while the exec
// still runs: the exec's exit must be published before the init's.
func TestExecAndInitExitOrder(t *testing.T) {
	ts := newTestService(t)
	ctx := context.Background()
	ts.mustCreateStart("c1")
	if _, err := ts.svc.Exec(ctx, &taskapi.ExecProcessRequest{ID: "c1", ExecID: "e1", Spec: processSpec(t, "sleep", "1")}); err != nil {
		t.Fatal(err)
	}
	_, err := ts.svc.Exec(ctx, &taskapi.ExecProcessRequest{ID: "c1", ExecID: "e1", Spec: processSpec(t, "true")})
	wantErr(t, err, errdefs.IsAlreadyExists, "exec id twice")
	if got := ts.state("c1", "e1"); got != tasktypes.Status_CREATED {
		t.Errorf("exec state before start = %v", got)
	}
	_, err = ts.svc.Kill(ctx, &taskapi.KillRequest{ID: "c1", ExecID: "e1", Signal: 9})
	wantErr(t, err, errdefs.IsFailedPrecondition, "kill an exec not started")
	if _, err := ts.svc.Start(ctx, &taskapi.StartRequest{ID: "c1", ExecID: "e1"}); err != nil {
		t.Fatal(err)
	}
	sb := ts.launcher.sandbox(0)
	if got := sb.callLog(); !contains(got, "exec c1 e1 [sleep 1]") {
		t.Errorf("calls = %v, want the exec started in the guest", got)
	}
	// The init dies; the exec goes only when the shim kills the rest.
	sb.proc("c1").exit(137)
	ts.wait("c1", "")
	if w := ts.wait("c1", "e1"); w.ExitStatus != 137 {
		t.Errorf("exec exit = %d", w.ExitStatus)
	}
	want := []string{TopicCreate, TopicStart, TopicExecAdded, TopicExecStarted, TopicExit, TopicExit}
	if got := ts.events.topics(); !reflect.DeepEqual(got, want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	exits := ts.events.find(TopicExit)
	if first := exits[0].(*eventstypes.TaskExit); first.ID != "e1" {
		t.Errorf("first exit is %q's, want the exec's: the init's exit must be last", first.ID)
	}
	if !contains(sb.callLog(), "kill c1 9 true") {
		t.Errorf("calls = %v, want the container's remaining processes killed", sb.callLog())
	}
	d, err := ts.svc.Delete(ctx, &taskapi.DeleteRequest{ID: "c1", ExecID: "e1"})
	if err != nil || d.ExitStatus != 137 {
		t.Fatalf("delete exec = %v, %v", d, err)
	}
	if _, err := ts.svc.Delete(ctx, &taskapi.DeleteRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if n := len(ts.events.find(TopicDelete)); n != 1 {
		t.Errorf("%d delete events, want 1 (execs have none)", n)
	}
}

// TestInitExitDuringExecStart: an exec that is starting when its
// container's init exits fails to start (the container is gone with its
// init) and never exits; the init's exit is published at once, not after
// the grace for execs (Docker's healthcheck execs, every second, met a
// docker rm -f this way and it waited the whole grace).
func TestInitExitDuringExecStart(t *testing.T) {
	ts := newTestService(t)
	ts.svc.execGrace = time.Minute
	ctx := context.Background()
	ts.mustCreateStart("c1")
	sb := ts.launcher.sandbox(0)
	starting, fail := make(chan struct{}), make(chan struct{})
	sb.mu.Lock()
	sb.execHook = func() error {
		close(starting)
		<-fail
		return fmt.Errorf("container c1 is stopped: %w", errdefs.ErrFailedPrecondition)
	}
	sb.mu.Unlock()
	if _, err := ts.svc.Exec(ctx, &taskapi.ExecProcessRequest{ID: "c1", ExecID: "hc", Spec: processSpec(t, "true")}); err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() {
		_, err := ts.svc.Start(ctx, &taskapi.StartRequest{ID: "c1", ExecID: "hc"})
		started <- err
	}()
	<-starting
	sb.proc("c1").exit(137)
	time.Sleep(100 * time.Millisecond) // the init's exit is waiting for the exec
	close(fail)
	if err := <-started; !errdefs.IsFailedPrecondition(err) {
		t.Errorf("the exec's start: %v", err)
	}
	t0 := time.Now()
	if w := ts.wait("c1", ""); w.ExitStatus != 137 {
		t.Errorf("init exit = %d", w.ExitStatus)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("the init's exit came %v after the exec's failed start", d)
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// TestEarlyExit ends the init while Start is in flight: the start event
// still comes before the exit.
func TestEarlyExit(t *testing.T) {
	ts := newTestService(t)
	if _, err := ts.create("c1", nil); err != nil {
		t.Fatal(err)
	}
	sb := ts.launcher.sandbox(0)
	sb.startHook = func(p *fakeProcess) {
		p.exit(1)
		time.Sleep(50 * time.Millisecond) // let the waiter see it
	}
	if _, err := ts.svc.Start(context.Background(), &taskapi.StartRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	ts.wait("c1", "")
	want := []string{TopicCreate, TopicStart, TopicExit}
	if got := ts.events.topics(); !reflect.DeepEqual(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
}

// TestKillCreated kills a container that never started, then deletes it.
func TestDeleteCreated(t *testing.T) {
	ts := newTestService(t)
	if _, err := ts.create("c1", nil); err != nil {
		t.Fatal(err)
	}
	d, err := ts.svc.Delete(context.Background(), &taskapi.DeleteRequest{ID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if d.ExitStatus != 137 {
		t.Errorf("delete of a created container: exit %d", d.ExitStatus)
	}
	want := []string{TopicCreate, TopicExit, TopicDelete}
	if got := ts.events.topics(); !reflect.DeepEqual(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
}

// TestPauseResume checks states and events.
func TestPauseResume(t *testing.T) {
	ts := newTestService(t)
	ctx := context.Background()
	ts.mustCreateStart("c1")
	if _, err := ts.svc.Pause(ctx, &taskapi.PauseRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if got := ts.state("c1", ""); got != tasktypes.Status_PAUSED {
		t.Errorf("state = %v", got)
	}
	if _, err := ts.svc.Resume(ctx, &taskapi.ResumeRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	want := []string{TopicCreate, TopicStart, TopicPaused, TopicResumed}
	if got := ts.events.topics(); !reflect.DeepEqual(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
}

// TestSandboxGrouping: a pod's containers share one VM booted once, with
// the sandbox container's annotations; a container of another pod is
// refused.
func TestSandboxGrouping(t *testing.T) {
	ts := newTestService(t)
	ts.launcher.gate = make(chan struct{})
	pod := func(id string) map[string]string {
		typ := "container"
		if id == "pause" {
			typ = "sandbox"
		}
		return map[string]string{oci.AnnotationCRISandboxID: "pause", oci.AnnotationCRIContainerType: typ, "io.cocoon.vcpus": "2"}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, id := range []string{"pause", "app"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = ts.create(id, pod(id))
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(ts.launcher.gate)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := ts.launcher.count(); n != 1 {
		t.Fatalf("%d VMs booted for one pod", n)
	}
	r := ts.launcher.launches[0]
	if r.ID != "pause" || r.Namespace != "ns" || r.Annotations["io.cocoon.vcpus"] != "2" {
		t.Errorf("launch request = %+v", r)
	}
	_, err := ts.create("other", map[string]string{oci.AnnotationCRISandboxID: "pod2", oci.AnnotationCRIContainerType: "container"})
	wantErr(t, err, errdefs.IsFailedPrecondition, "a container of another pod")
}

// TestBootFailure: a failed boot fails Create, and the next Create boots
// again.
func TestBootFailure(t *testing.T) {
	ts := newTestService(t)
	ts.launcher.fail = errors.New("no guest image")
	_, err := ts.create("c1", nil)
	if err == nil || !strings.Contains(err.Error(), "no guest image") {
		t.Fatalf("create = %v, want the boot error", err)
	}
	if _, err := ts.create("c1", nil); err != nil {
		t.Fatalf("create after a failed boot: %v", err)
	}
}

// TestQueries covers Pids, Stats, Update, Connect, Kill all, OOM events.
func TestQueries(t *testing.T) {
	ts := newTestService(t)
	ctx := context.Background()
	ts.mustCreateStart("c1")
	pids, err := ts.svc.Pids(ctx, &taskapi.PidsRequest{ID: "c1"})
	if err != nil || len(pids.Processes) != 2 || pids.Processes[1].Pid != 7 {
		t.Errorf("pids = %v, %v", pids, err)
	}
	st, err := ts.svc.Stats(ctx, &taskapi.StatsRequest{ID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Stats.GetTypeUrl() != "io.containerd.cgroups.v2.Metrics" {
		t.Errorf("stats type %q, want io.containerd.cgroups.v2.Metrics", st.Stats.GetTypeUrl())
	}
	limit := int64(64 << 20)
	res, _ := json.Marshal(specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}})
	if _, err := ts.svc.Update(ctx, &taskapi.UpdateTaskRequest{ID: "c1", Resources: &anypb.Any{TypeUrl: linuxResourcesURL, Value: res}}); err != nil {
		t.Fatal(err)
	}
	_, err = ts.svc.Update(ctx, &taskapi.UpdateTaskRequest{ID: "c1", Resources: &anypb.Any{TypeUrl: "bogus", Value: res}})
	wantErr(t, err, errdefs.IsInvalidArgument, "update with a foreign type")
	c, err := ts.svc.Connect(ctx, &taskapi.ConnectRequest{ID: "c1"})
	if err != nil || c.ShimPid != uint32(os.Getpid()) || c.TaskPid != fakeHostPID {
		t.Errorf("connect = %v, %v", c, err)
	}
	sb := ts.launcher.sandbox(0)
	sb.events <- SandboxEvent{Kind: EventOOM, ContainerID: "c1", OOMKills: 1}
	deadline := time.Now().Add(2 * time.Second)
	for len(ts.events.find(TopicOOM)) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := ts.events.find(TopicOOM); len(got) != 1 || got[0].(*eventstypes.TaskOOM).ContainerID != "c1" {
		t.Errorf("oom events = %v", got)
	}
	if _, err := ts.svc.Kill(ctx, &taskapi.KillRequest{ID: "c1", Signal: uint32(syscall.SIGKILL), All: true}); err != nil {
		t.Fatal(err)
	}
	if !contains(sb.callLog(), "update c1 memory=67108864") || !contains(sb.callLog(), "kill c1 9 true") {
		t.Errorf("calls = %v", sb.callLog())
	}
}

// TestCloseIO closes the process's stdin in the guest.
func TestCloseIO(t *testing.T) {
	ts := newTestService(t)
	p := ts.mustCreateStart("c1")
	if _, err := ts.svc.CloseIO(context.Background(), &taskapi.CloseIORequest{ID: "c1", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	closed := p.stdinClosed
	p.mu.Unlock()
	if !closed {
		t.Error("stdin not closed in the guest")
	}
}

// TestSandboxID covers the grouping rule.
func TestSandboxID(t *testing.T) {
	for _, tc := range []struct {
		ann   map[string]string
		id    string
		joins bool
	}{
		{nil, "c", false},
		{map[string]string{oci.AnnotationCRIContainerType: "sandbox", oci.AnnotationCRISandboxID: "c"}, "c", false},
		{map[string]string{oci.AnnotationCRIContainerType: "container", oci.AnnotationCRISandboxID: "pod"}, "pod", true},
		{map[string]string{oci.AnnotationCRISandboxID: "pod"}, "c", false},
	} {
		id, joins := SandboxID("c", tc.ann)
		if id != tc.id || joins != tc.joins {
			t.Errorf("SandboxID(c, %v) = %s, %v; want %s, %v", tc.ann, id, joins, tc.id, tc.joins)
		}
	}
}

// TestCloseDuringBoot: the shim shutting down while the VM boots stops
// the VM once booted, and the Create waiting for it fails.
func TestCloseDuringBoot(t *testing.T) {
	ts := newTestService(t)
	ts.launcher.gate = make(chan struct{})
	created := make(chan error, 1)
	go func() {
		_, err := ts.create("c1", nil)
		created <- err
	}()
	for ts.launcher.count() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- ts.svc.Close(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	close(ts.launcher.gate)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := <-created; !errdefs.IsAborted(err) {
		t.Errorf("create = %v, want aborted", err)
	}
	if !ts.launcher.sandbox(0).isStopped() {
		t.Error("the VM booted during shutdown still runs")
	}
}

// TestCreateRefusesHostNamespacesBeforeBooting: an option a VM cannot
// honour is refused by name before a VM boots or stdio opens, and never
// as NotImplemented, which containerd 2.x would take for "no task v3" and
// retry over task v2.
func TestCreateRefusesHostNamespacesBeforeBooting(t *testing.T) {
	ts := newTestService(t)
	dir := t.TempDir()
	spec := specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{Args: []string{"sh"}, Cwd: "/"},
		Root:    &specs.Root{Path: "rootfs"},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.MountNamespace},
		}},
	}
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ts.svc.Create(context.Background(), &taskapi.CreateTaskRequest{ID: "hostnet", Bundle: dir})
	if err == nil || !strings.Contains(err.Error(), "net") {
		t.Fatalf("create with the host network: %v, want an error naming it", err)
	}
	if errdefs.IsNotImplemented(err) || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("create refusal is %v, want a failed precondition", err)
	}
	ts.launcher.mu.Lock()
	defer ts.launcher.mu.Unlock()
	if len(ts.launcher.launches) != 0 {
		t.Fatalf("a VM was booted for a refused container")
	}
}

// TestDeleteLastContainer: deleting a pod's other container removes it
// from the guest; deleting the last one, exited, only flushes it and stops
// the VM, and one never started is still deleted in the guest, which is
// what kills it.
func TestDeleteLastContainer(t *testing.T) {
	ts := newTestService(t)
	ctx := context.Background()
	pod := func(id, typ string) map[string]string {
		return map[string]string{oci.AnnotationCRISandboxID: "pause", oci.AnnotationCRIContainerType: typ}
	}
	for _, c := range []struct{ id, typ string }{{"pause", "sandbox"}, {"app", "container"}} {
		if _, err := ts.create(c.id, pod(c.id, c.typ)); err != nil {
			t.Fatal(err)
		}
		if _, err := ts.svc.Start(ctx, &taskapi.StartRequest{ID: c.id}); err != nil {
			t.Fatal(err)
		}
	}
	sb := ts.launcher.sandbox(0)
	sb.proc("app").exit(0)
	ts.wait("app", "")
	if _, err := ts.svc.Delete(ctx, &taskapi.DeleteRequest{ID: "app"}); err != nil {
		t.Fatal(err)
	}
	if !contains(sb.callLog(), "delete app") || sb.isStopped() {
		t.Fatalf("calls = %v, stopped = %v; want app deleted in the guest and the VM running", sb.callLog(), sb.isStopped())
	}
	sb.proc("pause").exit(137)
	ts.wait("pause", "")
	d, err := ts.svc.Delete(ctx, &taskapi.DeleteRequest{ID: "pause"})
	if err != nil {
		t.Fatal(err)
	}
	if d.ExitStatus != 137 {
		t.Errorf("delete = %v", d)
	}
	if contains(sb.callLog(), "delete pause") || !contains(sb.callLog(), "flush pause") || !sb.isStopped() {
		t.Errorf("calls = %v, stopped = %v; want the last container flushed, not deleted in the guest, and the VM stopped", sb.callLog(), sb.isStopped())
	}
	if got := ts.events.topics(); got[len(got)-1] != TopicDelete {
		t.Errorf("events = %v, want the delete last", got)
	}

	// Never started: the guest delete kills the init.
	ts2 := newTestService(t)
	if _, err := ts2.create("c1", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ts2.svc.Delete(ctx, &taskapi.DeleteRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if sb := ts2.launcher.sandbox(0); !contains(sb.callLog(), "delete c1") || !sb.isStopped() {
		t.Errorf("calls = %v, stopped = %v; want the created container deleted in the guest, then the VM stopped", sb.callLog(), sb.isStopped())
	}
}

// TestOOMBeforeExit: an OOM kill the init's exit carries is published
// before the exit, once, whether the guest's event for it comes before or
// after; a later kill is published again.
func TestOOMBeforeExit(t *testing.T) {
	ts := newTestService(t)
	ts.mustCreateStart("c1")
	sb := ts.launcher.sandbox(0)
	sb.events <- SandboxEvent{Kind: EventOOM, ContainerID: "c1", OOMKills: 1}
	waitFor(t, func() bool { return len(ts.events.find(TopicOOM)) == 1 })
	sb.proc("c1").exitStatus(agent.ExitStatus{Code: 137, OOMKills: 2})
	ts.wait("c1", "")
	want := []string{TopicCreate, TopicStart, TopicOOM, TopicOOM, TopicExit}
	if got := ts.events.topics(); !reflect.DeepEqual(got, want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	// The guest's event for the second kill, late: already reported.
	sb.events <- SandboxEvent{Kind: EventOOM, ContainerID: "c1", OOMKills: 2}
	sb.events <- SandboxEvent{Kind: EventOOM, ContainerID: "c1", OOMKills: 3}
	waitFor(t, func() bool { return len(ts.events.find(TopicOOM)) == 3 })
	time.Sleep(20 * time.Millisecond)
	if n := len(ts.events.find(TopicOOM)); n != 3 {
		t.Errorf("%d OOM events, want 3 (kills 1, 2 and 3, each once)", n)
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestTiming: the init's Create and Start add their wall time, the VM's
// boot and the guest calls made meanwhile to the container's timing.
func TestTiming(t *testing.T) {
	ts := newTestService(t)
	ts.mustCreateStart("c1")
	ts.svc.mu.Lock()
	tm := ts.svc.containers["c1"].timing
	ts.svc.mu.Unlock()
	// The fake counts each guest call (create, start) as 1 ms.
	if tm.guest != 2*time.Millisecond || tm.calls < tm.vm+tm.guest || tm.shim() < 0 {
		t.Errorf("timing %+v (shim %v): want 2 ms of guest time inside the calls", tm, tm.shim())
	}
}
