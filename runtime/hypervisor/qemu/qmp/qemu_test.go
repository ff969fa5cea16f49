package qmp

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestRealQEMU talks to a real qemu-system-x86_64 with no machine.
func TestRealQEMU(t *testing.T) {
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not on PATH; install qemu-system-x86 to run this test")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "qmp.sock")
	cmd := exec.Command(bin, "-M", "none", "-nodefaults", "-no-user-config", "-display", "none",
		"-chardev", "socket,id=qmp,path="+sock+",server=on,wait=off", "-mon", "chardev=qmp,mode=control")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var c *Client
	for {
		c, err = Dial(ctx, sock, Options{})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("qmp never answered: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	defer c.Close()
	events, cancelEvents := c.Subscribe(16)
	defer cancelEvents()

	v, err := c.QueryVersion(ctx)
	if err != nil || v.QEMU.Major == 0 {
		t.Fatalf("QueryVersion = %+v, %v", v, err)
	}
	t.Logf("qemu %s (%s)", v, v.Package)

	if err := c.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	expectEvent(t, events, EventStop)
	st, err := c.QueryStatus(ctx)
	if err != nil || st.Running || st.Status != "paused" {
		t.Fatalf("status after stop = %+v, %v", st, err)
	}
	if err := c.Cont(ctx); err != nil {
		t.Fatalf("cont: %v", err)
	}
	expectEvent(t, events, EventResume)

	// A descriptor handed over with getfd is held under its name until
	// closefd; the second closefd finds nothing.
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SendFile(ctx, "probe", f); err != nil {
		t.Fatalf("SendFile: %v", err)
	}
	f.Close()
	if err := c.CloseFile(ctx, "probe"); err != nil {
		t.Fatalf("CloseFile: %v", err)
	}
	var qe *Error
	if err := c.CloseFile(ctx, "probe"); !errors.As(err, &qe) {
		t.Fatalf("second CloseFile = %v, want a qmp error", err)
	}
	if err := c.Execute(ctx, "no-such-command", nil, nil); !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Fatalf("unknown command: %v", err)
	}

	if err := c.Quit(ctx); err != nil {
		t.Fatalf("quit: %v", err)
	}
	expectEvent(t, events, EventShutdown)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("qemu exit: %v", err)
		}
		exited <- err // for Cleanup
	case <-ctx.Done():
		t.Fatal("qemu did not exit after quit")
	}
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("client did not notice the hangup")
	}
}

func expectEvent(t *testing.T, events <-chan Event, name string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("events closed while waiting for %s", name)
			}
			if e.Name == name {
				return
			}
		case <-timeout:
			t.Fatalf("no %s event", name)
		}
	}
}
