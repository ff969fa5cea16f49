package task

import (
	"context"
	"testing"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/typeurl/v2"
)

// pidsLauncher boots fakeSandboxes whose ContainerPids lists the guest
// pids of a container's fake processes and one more, 150, that the shim
// did not start (a child of the init).
type pidsLauncher struct{ *fakeLauncher }

func (l pidsLauncher) Launch(ctx context.Context, r LaunchRequest) (Sandbox, error) {
	sb, err := l.fakeLauncher.Launch(ctx, r)
	if err != nil {
		return nil, err
	}
	return pidsSandbox{sb.(*fakeSandbox)}, nil
}

type pidsSandbox struct{ *fakeSandbox }

func (s pidsSandbox) ContainerPids(ctx context.Context, id string) ([]uint32, error) {
	out := []uint32{150}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		out = append(out, p.pid)
	}
	return out, nil
}

// TestPidsHoldTheTaskPid: the task's pid (the VMM's) is among the pids
// Pids lists, standing for the container's init; the other processes
// keep their guest pids, and an exec's entry names its exec id.
func TestPidsHoldTheTaskPid(t *testing.T) {
	ts := &testService{t: t, launcher: &fakeLauncher{}, events: &recorder{}}
	ts.svc = New(Options{Namespace: "ns", Launcher: pidsLauncher{ts.launcher}, Publisher: ts.events, ExecExitGrace: time.Second})
	t.Cleanup(func() { _ = ts.svc.Close(context.Background()) })
	ctx := context.Background()
	ts.mustCreateStart("c1")
	if _, err := ts.svc.Exec(ctx, &taskapi.ExecProcessRequest{ID: "c1", ExecID: "e1", Spec: processSpec(t, "sleep", "60")}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.svc.Start(ctx, &taskapi.StartRequest{ID: "c1", ExecID: "e1"}); err != nil {
		t.Fatal(err)
	}
	st, err := ts.svc.State(ctx, &taskapi.StateRequest{ID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := ts.svc.Pids(ctx, &taskapi.PidsRequest{ID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint32]string{}
	for _, p := range resp.Processes {
		got[p.Pid] = "-"
		if p.Info != nil {
			v, err := typeurl.UnmarshalAny(p.Info)
			if err != nil {
				t.Fatalf("info of pid %d: %v", p.Pid, err)
			}
			d, ok := v.(*runcoptions.ProcessDetails)
			if !ok {
				t.Fatalf("info of pid %d is a %T, want runc's ProcessDetails", p.Pid, v)
			}
			got[p.Pid] = d.ExecID
		}
	}
	want := map[uint32]string{st.Pid: "-", 150: "-", 200: "e1"}
	if st.Pid != fakeHostPID || len(got) != len(want) || len(resp.Processes) != len(want) {
		t.Fatalf("task pid %d, pids %v, want %v", st.Pid, got, want)
	}
	for pid, info := range want {
		if got[pid] != info {
			t.Errorf("pid %d: info %q, want %q (all: %v)", pid, got[pid], info, got)
		}
	}
}
