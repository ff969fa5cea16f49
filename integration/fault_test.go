package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// The fault suite: each case breaks a sandbox the way a host or a guest
// can, through real containerd and ctr with real VMs, and ends with a
// leak audit. The shim killed with SIGKILL is TestShimKilled; a hostile
// layer is TestCopyBackHostile; a guest that writes garbage on the agent
// channel is TestGuestSendsGarbage in runtime/sandbox (the released agent
// cannot be made to, so a unit-level guest does).

// TestFaultVMKilled SIGKILLs the QEMU of a sandbox under its running
// container and a running exec: both get their exits (137: killed with
// the VM), the exec's first, and the task and container can be removed.
func TestFaultVMKilled(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, stateDir := shimContainerd(t, v)
			removeAtEnd(t, c, "vmkill")
			events := c.WatchEvents(t)
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "vmkill", "sleep", "600")
			c.WaitStatus(t, "vmkill", "RUNNING")
			ex := startAttached(t, c, "task", "exec", "--exec-id", "e1", "vmkill", "sh", "-c", "echo exec-up; exec sleep 600")
			ex.out.waitLine(t, "exec-up")
			// The exec's output can come before its Start has returned:
			// a VM killed in between fails the Start, not the process.
			if !events.WaitFor("/tasks/exec-started", `"exec_id":"e1"`, 30*time.Second) {
				t.Fatal("no exec-started event for e1")
			}
			if err := syscall.Kill(taskPID(t, c, "vmkill"), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if st := ex.exitStatus(t); st != 137 {
				t.Errorf("exec exit status %d, want 137", st)
			}
			c.WaitStatus(t, "vmkill", "STOPPED")
			if !events.WaitFor("/tasks/exit", `"id":"vmkill"`, 10*time.Second) {
				t.Fatal("no exit event for the init")
			}
			exits := events.Seen("/tasks/exit")
			if len(exits) != 2 || !strings.Contains(exits[0].Body, `"id":"e1"`) || !strings.Contains(exits[1].Body, `"exit_status":137`) {
				t.Errorf("exit events %v: want the exec's, then the init's with 137", exits)
			}
			c.MustCtr("task", "rm", "vmkill")
			c.MustCtr("container", "rm", "vmkill")
			events.Stop()
			leakAudit(t, c, filepath.Dir(stateDir))
		})
	}
}

// TestFaultContainerdRestart restarts containerd under running
// containers: they keep running, and afterwards containerd reaches their
// shim again for ls, exec, kill and delete.
func TestFaultContainerdRestart(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, stateDir := shimContainerd(t, v)
			removeAtEnd(t, c, "survivor")
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "survivor", "sh", "-c", "echo 1 > /tmp/mark; exec sleep 600")
			c.WaitStatus(t, "survivor", "RUNNING")
			qemu := taskPID(t, c, "survivor")
			if err := c.Restart(); err != nil {
				t.Fatal(err)
			}
			c.WaitStatus(t, "survivor", "RUNNING")
			if got := taskPID(t, c, "survivor"); got != qemu {
				t.Errorf("task pid %d after the restart, was %d", got, qemu)
			}
			if out := c.MustCtr("task", "exec", "--exec-id", "after", "survivor", "cat", "/tmp/mark"); strings.TrimSpace(out) != "1" {
				t.Errorf("exec after the restart: %q", out)
			}
			killAndRemove(t, c, "survivor")
			leakAudit(t, c, filepath.Dir(stateDir))
		})
	}
}

// TestFaultGuestHung stops QEMU with SIGSTOP, a guest that answers
// nothing: the next call fails after runtime.agent_timeout (10 s here: a
// create under TCG on a loaded host can take several) naming it, the
// sandbox is declared dead and ended, and its container is removed.
func TestFaultGuestHung(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, stateDir := shimContainerd(t, v)
			root := filepath.Dir(stateDir)
			if err := os.WriteFile(filepath.Join(root, "config.toml"), []byte("[runtime]\nagent_timeout = \"10s\"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			removeAtEnd(t, c, "hung")
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "hung", "sleep", "600")
			c.WaitStatus(t, "hung", "RUNNING")
			qemu := taskPID(t, c, "hung")
			if err := syscall.Kill(qemu, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = syscall.Kill(qemu, syscall.SIGCONT) })
			began := time.Now()
			_, err := c.Ctr("task", "exec", "--exec-id", "late", "hung", "true")
			if err == nil || !strings.Contains(err.Error(), "did not answer within 10s") {
				t.Errorf("exec in a hung guest: %v, want the agent timeout", err)
			}
			if d := time.Since(began); d > 30*time.Second {
				t.Errorf("exec in a hung guest took %v", d)
			}
			c.WaitStatus(t, "hung", "STOPPED")
			c.MustCtr("task", "rm", "hung")
			c.MustCtr("container", "rm", "hung")
			leakAudit(t, c, root)
		})
	}
}

// TestFaultQEMUFails: a QEMU that cannot start (a missing binary, an
// argument it refuses) fails the create with QEMU's own words, and
// leaves nothing.
func TestFaultQEMUFails(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "qemu-bad-arg")
	script := "#!/bin/sh\nexec /usr/bin/qemu-system-x86_64 -no-such-option \"$@\"\n"
	if err := os.WriteFile(bad, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, qemu, want string }{
		{"missing", "/nonexistent/qemu-system-x86_64", "/nonexistent/qemu-system-x86_64"},
		{"bad-argument", bad, "-no-such-option: invalid option"},
	}
	for _, v := range versions {
		for _, tc := range cases {
			t.Run(v+"/"+tc.name, func(t *testing.T) {
				t.Setenv("COCOON_QEMU", tc.qemu)
				c, img, stateDir := shimContainerd(t, v)
				removeAtEnd(t, c, "noboot")
				out, err := c.Ctr("run", "--rm", "--runtime", runtimeName, img, "noboot", "true")
				if err == nil || !strings.Contains(err.Error()+out, tc.want) {
					t.Errorf("run with QEMU %s: %v %s, want an error with %q", tc.qemu, err, out, tc.want)
				}
				_, _ = c.Ctr("container", "rm", "noboot")
				leakAudit(t, c, filepath.Dir(stateDir))
			})
		}
	}
}

// TestFaultCycles creates and deletes 50 containers, 4 at a time, and
// then audits: nothing left, containerd's descriptors and memory where
// they were, and a pod's shim, whose containers came and went meanwhile,
// holding no more descriptors than before.
func TestFaultCycles(t *testing.T) {
	const total, parallel, podCycles = 50, 4, 10
	c, img, stateDir := shimContainerd(t, "2.4")
	removeAtEnd(t, c, "pod")
	c.MustCtr("run", "-d", "--runtime", runtimeName,
		"--annotation", "io.kubernetes.cri.container-type=sandbox",
		"--annotation", "io.kubernetes.cri.sandbox-id=pod", img, "pod", "sleep", "3600")
	c.WaitStatus(t, "pod", "RUNNING")
	shims := harness.ShimPIDs(c.Address)
	if len(shims) != 1 {
		t.Fatalf("shims: %v", shims)
	}
	podCycle := func(i int) {
		id := fmt.Sprintf("podapp%d", i)
		if out, err := c.Ctr("run", "--rm", "--runtime", runtimeName,
			"--annotation", "io.kubernetes.cri.container-type=container",
			"--annotation", "io.kubernetes.cri.sandbox-id=pod", img, id, "true"); err != nil {
			t.Errorf("pod container %s: %v %s", id, err, out)
		}
	}
	podCycle(0) // the first container of a pod sets up what stays
	ctrdBefore, shimBefore := usageOf(t, c.PID()), usageOf(t, shims[0])

	began := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				id := fmt.Sprintf("cycle%d", i)
				if out, err := c.Ctr("run", "--rm", "--runtime", runtimeName, img, id, "true"); err != nil {
					t.Errorf("cycle %d: %v %s", i, err, out)
					_, _ = c.Ctr("task", "rm", "-f", id)
					_, _ = c.Ctr("container", "rm", id)
				}
			}
		}()
	}
	for i := 0; i < total; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	for i := 1; i <= podCycles; i++ {
		podCycle(i)
	}
	elapsed := time.Since(began)
	ctrdAfter, shimAfter := usageOf(t, c.PID()), usageOf(t, shims[0])
	t.Logf("%d containers, %d at a time, and %d in a pod, in %v", total, parallel, podCycles, elapsed.Round(time.Millisecond))
	t.Logf("containerd: %d fds, %d KiB RSS before; %d fds, %d KiB after", ctrdBefore.fds, ctrdBefore.rssKiB, ctrdAfter.fds, ctrdAfter.rssKiB)
	t.Logf("pod shim: %d fds, %d KiB RSS before; %d fds, %d KiB after", shimBefore.fds, shimBefore.rssKiB, shimAfter.fds, shimAfter.rssKiB)
	if shimAfter.fds > shimBefore.fds {
		t.Errorf("the pod's shim holds %d descriptors after %d containers came and went, %d before", shimAfter.fds, podCycles, shimBefore.fds)
	}
	// containerd keeps per-connection state that comes and goes; a leak
	// per container would show as dozens.
	if ctrdAfter.fds > ctrdBefore.fds+10 {
		t.Errorf("containerd holds %d descriptors after %d containers, %d before", ctrdAfter.fds, total, ctrdBefore.fds)
	}
	killAndRemove(t, c, "pod")
	leakAudit(t, c, filepath.Dir(stateDir))
}
