package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/runtime/agent"
)

// TestStandaloneBinary builds the static agent, runs it as an ordinary
// process on a unix socket and drives it with the host client.
func TestStandaloneBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "cocoon-agent")
	build := exec.Command("go", "build", "-o", bin, "-ldflags", "-X github.com/cocoonrt/cocoon/guest/agent.Version=v-test", ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "agent.sock")
	cmd := exec.Command(bin, "--listen", "unix:"+sock, "--subreaper")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conn net.Conn
	for {
		var err error
		if conn, err = net.Dial("unix", sock); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("agent never listened: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c, err := agent.Connect(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Version != "v-test" {
		t.Fatalf("version %q", info.Version)
	}
	var out bytes.Buffer
	p, err := c.Start(ctx, agent.ProcessSpec{ID: "hi", Args: []string{"sh", "-c", "sleep 0.1 & echo hi; exit 2"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 2 || out.String() != "hi\n" {
		t.Fatalf("got %+v %v %q", st, err, out.String())
	}
	// Shutdown outside PID 1 is refused by the agent's System, and is
	// still answered.
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}
