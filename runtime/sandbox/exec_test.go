package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	guestagent "github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/runtime/rootfs"
)

// TestExecUndo: an exec whose call is cancelled before the guest has
// started the process (the OCI runtime's exec is slow here) is killed
// and reaped in the guest once it has started: nothing of it is left.
func TestExecUndo(t *testing.T) {
	agenttest.NeedContainers(t)
	rt, err := agenttest.Runtime()
	if err != nil {
		t.Skip(err)
	}
	slow := filepath.Join(t.TempDir(), "slow-exec-runtime")
	script := fmt.Sprintf("#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = exec ] && sleep 1 && break; done\nexec %s \"$@\"\n", rt)
	if err := os.WriteFile(slow, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(agenttest.RuntimeEnv, slow)
	s, _, _ := containerSandbox(t, guestagent.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	init, err := s.CreateContainer(ctx, ContainerSpec{
		ID: "web", Spec: hostSpec(false, "sleep", "1000"),
		Rootfs: []rootfs.Mount{{Type: "overlay", Source: "overlay"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StartContainer(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	before, err := s.ContainerPids(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	// Cancelled, as containerd cancels a request whose client went
	// away: unlike a deadline, that does not reach the guest, which goes
	// on and starts the process.
	short, cancelShort := context.WithCancel(ctx)
	time.AfterFunc(200*time.Millisecond, cancelShort)
	began := time.Now()
	_, err = s.ExecProcess(short, "web", "late", &specs.Process{Args: []string{"sleep", "600"}, Cwd: "/", Env: []string{"PATH=/bin"}}, nil, nil, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("exec cancelled: %v", err)
	}
	if d := time.Since(began); d < time.Second {
		t.Errorf("exec returned after %v: the undo did not wait for the late start", d)
	}
	// The undo runs before ExecProcess returns.
	after, err := s.ContainerPids(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("container pids %v after the undone exec, %v before", after, before)
	}
	if err := s.KillContainer(ctx, "web", syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	if _, err := init.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteContainer(ctx, "web"); err != nil {
		t.Fatal(err)
	}
}
