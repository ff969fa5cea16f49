package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// TestShimLongNames runs a container whose namespace and id are as long
// as containerd allows (76 characters each, identifiers.Validate), which
// puts the sandbox's socket paths far beyond the 107 bytes of a unix
// socket address: it runs, answers an exec and ps, and is removed. Then
// its shim is SIGKILLed under a second such container, and `shim delete`
// finds the VM and removes everything from the state dir alone.
func TestShimLongNames(t *testing.T) {
	ns := "ns-" + strings.Repeat("n", 70) + ".x2"
	ids := []string{"id-" + strings.Repeat("i", 70) + "_a1", "id-" + strings.Repeat("k", 70) + "_b2"}
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, _, stateDir := shimContainerd(t, v)
			c.Namespace = ns
			img := harness.ImportBusybox(t, c)
			removeAtEnd(t, c, ids...)
			sandboxDir := filepath.Join(stateDir, ns, ids[0])
			if n := len(filepath.Join(sandboxDir, "qmp.sock")); n <= 107 {
				t.Fatalf("the socket path is %d bytes: not a test of long paths", n)
			}
			if out, err := c.Ctr("run", "--rm", "--runtime", runtimeName, img, ids[0], "echo", "long-names"); err != nil || strings.TrimSpace(out) != "long-names" {
				t.Fatalf("ctr run: %q, %v", out, err)
			}
			c.WaitNoShim(t)

			c.MustCtr("run", "-d", "--runtime", runtimeName, img, ids[1], "sleep", "600")
			c.WaitStatus(t, ids[1], "RUNNING")
			if out := c.MustCtr("task", "exec", "--exec-id", "e1", ids[1], "echo", "from-exec"); strings.TrimSpace(out) != "from-exec" {
				t.Errorf("exec output %q", out)
			}
			waitPids(t, c, ids[1], 1)
			pids := harness.ShimPIDs(c.Address)
			if len(pids) != 1 {
				t.Fatalf("shims: %v", pids)
			}
			if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			sandboxDir = filepath.Join(stateDir, ns, ids[1])
			deadline := time.Now().Add(30 * time.Second)
			for {
				if _, err := os.Stat(sandboxDir); os.IsNotExist(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sandbox state still there 30 s after its shim was killed")
				}
				time.Sleep(200 * time.Millisecond)
			}
			c.Ctr("task", "rm", "-f", ids[1])
			c.MustCtr("container", "rm", ids[1])
		})
	}
}
