package sandbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	guestagent "github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/runtime/rootfs"
)

// TestCheckpointRefusesPodMember: a checkpoint captures the whole VM, so
// the checkpoint of one container of several is refused, naming the
// others, before anything is paused or written; an unknown container is
// NotFound.
func TestCheckpointRefusesPodMember(t *testing.T) {
	s, _, _ := containerSandbox(t, guestagent.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, id := range []string{"pause", "app"} {
		if _, err := s.CreateContainer(ctx, ContainerSpec{
			ID: id, Spec: hostSpec(false, "sleep", "1000"), Rootfs: []rootfs.Mount{{Type: "overlay", Source: "overlay"}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	_, err := s.Checkpoint(ctx, CheckpointOptions{Dir: dir, ContainerID: "app", Namespace: "ns"})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "also runs pause") {
		t.Fatalf("checkpoint of a pod member: %v", err)
	}
	if p, _ := s.Phase(); p != PhaseReady {
		t.Fatalf("after a refused checkpoint the sandbox is %s", p)
	}
	if _, err := s.Checkpoint(ctx, CheckpointOptions{Dir: dir, ContainerID: "nope"}); !errdefs.IsNotFound(err) {
		t.Fatalf("checkpoint of an unknown container: %v", err)
	}
}
