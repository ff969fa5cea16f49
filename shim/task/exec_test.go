package task

import (
	"context"
	"testing"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
)

// TestCloseIOAfterExit: CloseIO on an exec that has exited (its stdin
// reached EOF and it ended) succeeds until the exec is deleted, as with
// runc's shim, without a call into the guest, which has forgotten the
// process; after the delete it is not found.
func TestCloseIOAfterExit(t *testing.T) {
	ts := newTestService(t)
	ctx := context.Background()
	ts.mustCreateStart("c1")
	if _, err := ts.svc.Exec(ctx, &taskapi.ExecProcessRequest{ID: "c1", ExecID: "e1", Spec: processSpec(t, "cat")}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.svc.Start(ctx, &taskapi.StartRequest{ID: "c1", ExecID: "e1"}); err != nil {
		t.Fatal(err)
	}
	exec := ts.launcher.sandbox(0).proc("c1/e1")
	exec.exit(0)
	ts.wait("c1", "e1")
	if _, err := ts.svc.CloseIO(ctx, &taskapi.CloseIORequest{ID: "c1", ExecID: "e1", Stdin: true}); err != nil {
		t.Fatalf("close the stdin of an exited exec: %v", err)
	}
	exec.mu.Lock()
	asked := exec.stdinClosed
	exec.mu.Unlock()
	if asked {
		t.Error("CloseIO of an exited exec called into the guest")
	}
	if _, err := ts.svc.Delete(ctx, &taskapi.DeleteRequest{ID: "c1", ExecID: "e1"}); err != nil {
		t.Fatal(err)
	}
	_, err := ts.svc.CloseIO(ctx, &taskapi.CloseIORequest{ID: "c1", ExecID: "e1", Stdin: true})
	wantErr(t, err, errdefs.IsNotFound, "close the stdin of a deleted exec")
}
