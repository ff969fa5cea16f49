package task

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/runtime/agent"
	eventstypes "github.com/containerd/containerd/api/events"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
)

// TestSandboxDies: a VM that dies under a running container and a running
// exec gives both their exits, the exec's first, as killed; then the
// exec and the container can be deleted, and the VM is stopped.
func TestSandboxDies(t *testing.T) {
	ts := newTestService(t)
	ctx := context.Background()
	ts.mustCreateStart("c1")
	if _, err := ts.svc.Exec(ctx, &taskapi.ExecProcessRequest{ID: "c1", ExecID: "e1", Spec: processSpec(t, "sleep", "1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.svc.Start(ctx, &taskapi.StartRequest{ID: "c1", ExecID: "e1"}); err != nil {
		t.Fatal(err)
	}
	sb := ts.launcher.sandbox(0)
	sb.die()
	if w := ts.wait("c1", ""); w.ExitStatus != killedWithVM {
		t.Errorf("init exit = %d, want %d", w.ExitStatus, killedWithVM)
	}
	if w := ts.wait("c1", "e1"); w.ExitStatus != killedWithVM {
		t.Errorf("exec exit = %d, want %d", w.ExitStatus, killedWithVM)
	}
	var exits []string
	for _, e := range ts.events.find(TopicExit) {
		exits = append(exits, e.(*eventstypes.TaskExit).ID)
	}
	if want := []string{"e1", "c1"}; !reflect.DeepEqual(exits, want) {
		t.Errorf("exit events for %v, want %v (execs before the init)", exits, want)
	}
	if _, err := ts.svc.Kill(ctx, &taskapi.KillRequest{ID: "c1", Signal: 9, All: true}); !errdefs.IsNotFound(err) {
		t.Errorf("kill after death: %v, want not found", err)
	}
	if _, err := ts.svc.Delete(ctx, &taskapi.DeleteRequest{ID: "c1", ExecID: "e1"}); err != nil {
		t.Fatalf("delete exec: %v", err)
	}
	if _, err := ts.svc.Delete(ctx, &taskapi.DeleteRequest{ID: "c1"}); err != nil {
		t.Fatalf("delete container: %v", err)
	}
	if !sb.isStopped() {
		t.Error("the dead sandbox was not stopped after its last delete")
	}
}

// TestCloseIsTerminal: nothing is created, and no VM booted, after Close.
func TestCloseIsTerminal(t *testing.T) {
	ts := newTestService(t)
	if err := ts.svc.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err := ts.create("c1", nil)
	wantErr(t, err, errdefs.IsUnavailable, "create after close")
	if n := ts.launcher.count(); n != 0 {
		t.Errorf("%d VMs booted after close", n)
	}
}

// TestFailedFirstCreateStopsVM: the VM booted for a Create that then
// fails is stopped at once, and the next Create boots a new one.
func TestFailedFirstCreateStopsVM(t *testing.T) {
	ts := newTestService(t)
	ts.launcher.createFail = errors.New("crun create failed")
	if _, err := ts.create("c1", nil); err == nil {
		t.Fatal("create succeeded")
	}
	if !ts.launcher.sandbox(0).isStopped() {
		t.Error("the VM of a failed first create is still up")
	}
	ts.launcher.createFail = nil
	ts.mustCreateStart("c2")
	if n := ts.launcher.count(); n != 2 {
		t.Errorf("%d boots, want 2", n)
	}
}

// TestOOMEventsBounded: an event that reports no kill is dropped, and a
// guest that reports kills faster than oomEventGap gets one TaskOOM per
// gap; the kills an init's exit carries are published before the exit
// at once.
func TestOOMEventsBounded(t *testing.T) {
	ts := newTestService(t)
	p := ts.mustCreateStart("c1")
	sb := ts.launcher.sandbox(0)
	sb.events <- SandboxEvent{Kind: EventOOM, ContainerID: "c1", OOMKills: 0}
	for i := uint64(1); i <= 5; i++ {
		sb.events <- SandboxEvent{Kind: EventOOM, ContainerID: "c1", OOMKills: i}
	}
	deadline := time.Now().Add(2 * time.Second)
	for len(ts.events.find(TopicOOM)) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(oomEventGap / 4)
	if n := len(ts.events.find(TopicOOM)); n != 1 {
		t.Errorf("%d TaskOOM events right after a burst of 5 kills, want 1", n)
	}
	// The rest of the burst follows as one event once the gap passed.
	waitFor(t, func() bool { return len(ts.events.find(TopicOOM)) == 2 })
	time.Sleep(oomEventGap)
	if n := len(ts.events.find(TopicOOM)); n != 2 {
		t.Errorf("%d TaskOOM events for a burst of 5 kills, want 2", n)
	}
	p.exitStatus(agent.ExitStatus{Code: 137, OOMKills: 6})
	ts.wait("c1", "")
	topics := ts.events.topics()
	if n := len(ts.events.find(TopicOOM)); n != 3 {
		t.Errorf("%d TaskOOM events after the exit that carried more kills, want 3: %v", n, topics)
	}
	if topics[len(topics)-1] != TopicExit || topics[len(topics)-2] != TopicOOM {
		t.Errorf("events %v: want the OOM right before the exit", topics)
	}
}
