package task

import (
	"context"
	"strings"
	"testing"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	runcopts "github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cocoonrt/cocoon/oci"
)

func TestCheckpointOptions(t *testing.T) {
	ctx := context.Background()
	exit, err := typeurl.MarshalAnyToProto(&runcopts.CheckpointOptions{Exit: true, OpenTcp: true, ImagePath: "/x"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := typeurl.MarshalAnyToProto(&runcopts.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		in    *anypb.Any
		exit  bool
		isErr bool
	}{
		{name: "nil, as containerd 1.x sends for a runtime that is not runc", in: nil},
		{name: "empty", in: &anypb.Any{}},
		{name: "runc options with exit", in: exit, exit: true},
		{name: "another type", in: other, isErr: true},
		{name: "garbage", in: &anypb.Any{TypeUrl: "containerd.runc.v1.CheckpointOptions", Value: []byte{0xff, 0xff}}, isErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := checkpointOptions(ctx, tc.in)
			if tc.isErr {
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("err %v, want invalid argument", err)
				}
				return
			}
			if err != nil || o.Exit != tc.exit {
				t.Fatalf("got %+v, %v", o, err)
			}
		})
	}
}

// TestCheckpointAndRestore: Checkpoint reaches the sandbox with what the
// client asked (exit, whether it paused first, the namespace); a Create
// naming a checkpoint restores a sandbox of its own instead of booting
// one, and its Start goes to the sandbox as for a created container.
func TestCheckpointAndRestore(t *testing.T) {
	ctx := context.Background()
	ts := newTestService(t)
	ts.mustCreateStart("c1")
	sb := ts.launcher.sandbox(0)
	if _, err := ts.svc.Checkpoint(ctx, &taskapi.CheckpointTaskRequest{ID: "c1", Path: "/tmp/ck1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.svc.Pause(ctx, &taskapi.PauseRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	exit, _ := typeurl.MarshalAnyToProto(&runcopts.CheckpointOptions{Exit: true})
	if _, err := ts.svc.Checkpoint(ctx, &taskapi.CheckpointTaskRequest{ID: "c1", Path: "/tmp/ck2", Options: exit}); err != nil {
		t.Fatal(err)
	}
	calls := strings.Join(sb.callLog(), "\n")
	for _, want := range []string{"checkpoint c1 to /tmp/ck1 exit=false paused=false ns=ns", "checkpoint c1 to /tmp/ck2 exit=true paused=true ns=ns"} {
		if !strings.Contains(calls, want) {
			t.Errorf("calls lack %q:\n%s", want, calls)
		}
	}
	_, err := ts.svc.Checkpoint(ctx, &taskapi.CheckpointTaskRequest{ID: "c1"})
	wantErr(t, err, errdefs.IsInvalidArgument, "checkpoint without a directory")
	_, err = ts.svc.Checkpoint(ctx, &taskapi.CheckpointTaskRequest{ID: "nope", Path: "/tmp/x"})
	wantErr(t, err, errdefs.IsNotFound, "checkpoint of an unknown container")

	// This shim serves c1's sandbox: a restore into it is refused.
	_, err = ts.svc.Create(ctx, &taskapi.CreateTaskRequest{ID: "r0", Bundle: ts.bundle(nil), Checkpoint: "/tmp/ck1"})
	wantErr(t, err, errdefs.IsFailedPrecondition, "restore into a shim that runs a sandbox")

	rs := newTestService(t)
	resp, err := rs.svc.Create(ctx, &taskapi.CreateTaskRequest{ID: "r1", Bundle: rs.bundle(nil), Checkpoint: "/tmp/ck1"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Pid != fakeHostPID {
		t.Errorf("pid %d", resp.Pid)
	}
	if got := rs.state("r1", ""); got != tasktypes.Status_CREATED {
		t.Errorf("restored task is %v, want created until Start", got)
	}
	if _, err := rs.svc.Start(ctx, &taskapi.StartRequest{ID: "r1"}); err != nil {
		t.Fatal(err)
	}
	calls = strings.Join(rs.launcher.sandbox(0).callLog(), "\n")
	if !strings.Contains(calls, "restore r1 from /tmp/ck1") || !strings.Contains(calls, "start r1") {
		t.Errorf("restore calls:\n%s", calls)
	}

	// A pod's container cannot be restored into the pod.
	ps := newTestService(t)
	_, err = ps.svc.Create(ctx, &taskapi.CreateTaskRequest{ID: "c2", Checkpoint: "/tmp/ck1",
		Bundle: ps.bundle(map[string]string{oci.AnnotationCRIContainerType: oci.CRIContainerTypeContainer, oci.AnnotationCRISandboxID: "pod"})})
	wantErr(t, err, errdefs.IsFailedPrecondition, "restore into a pod")
	if ps.launcher.count() != 0 {
		t.Errorf("a refused restore launched %d sandboxes", ps.launcher.count())
	}
}
