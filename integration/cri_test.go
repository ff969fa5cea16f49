package integration

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// TestCRIRunc drives containerd's CRI with crictl and runc: the harness's
// own test (its CRI configuration, pause image, CNI network and clean-up
// checks) on a runtime known to work, for the same pod Cocoon's runs.
func TestCRIRunc(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c := harness.StartContainerd(t, v, harness.WithCRI(harness.CRIConfig{}))
			runTwoContainerPod(t, c, harness.RuncRuntimeHandler)
		})
	}
}

// criLogLine is a line of a CRI container log: time, stream, P(artial)
// or F(ull), the text.
var criLogLine = regexp.MustCompile(`^(\S+) (stdout|stderr) ([PF]) (.*)$`)

// runTwoContainerPod runs a pod with the runtime handler handler and two
// busybox containers in it: a server on port 8080 and a client that
// reaches it on 127.0.0.1, the pod's network being theirs. It checks exec
// through the stream server and ExecSync, the logs in the CRI's format at
// the log path, stop and removal, and that nothing is left after.
func runTwoContainerPod(t *testing.T, c *harness.Containerd, handler string) {
	x := harness.NewCrictl(t, c)
	img := harness.ImportBusyboxCRI(t, c)

	pod := x.PodConfig("two")
	podID := x.RunPod(t, pod, handler)
	p := x.InspectPod(t, podID)
	if p.Status.State != "SANDBOX_READY" || p.Status.RuntimeHandler != handler || !c.CRISubnet().Contains(net.ParseIP(p.Status.Network.IP)) {
		t.Errorf("pod: state %s, handler %q, address %q; want SANDBOX_READY, %q, an address in %v", p.Status.State, p.Status.RuntimeHandler, p.Status.Network.IP, handler, c.CRISubnet())
	}

	server := x.CreateContainer(t, podID, x.ContainerConfig("server", img, "sh", "-c",
		"echo server up; echo to stderr >&2; exec nc -ll -p 8080 -e echo hi"), pod)
	x.Start(t, server)
	client := x.CreateContainer(t, podID, x.ContainerConfig("client", img, "sleep", "3600"), pod)
	x.Start(t, client)

	// The client reaches the server on the pod's loopback, once it listens.
	var got string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if got = strings.TrimSpace(x.Exec(t, client, "sh", "-c", "nc 127.0.0.1 8080 </dev/null || true")); got == "hi" {
			break
		}
	}
	if got != "hi" {
		t.Errorf("the client got %q from the server on 127.0.0.1:8080, want hi", got)
	}
	// crictl ends what ExecSync's stdout has with a new line of its own.
	if out := strings.TrimSpace(x.ExecSync(t, client, "sh", "-c", "echo $((6*7)); hostname")); out != "42\ntwo" {
		t.Errorf("exec -s: %q, want 42 and the pod's hostname", out)
	}

	s := x.Inspect(t, server)
	if s.Status.State != "CONTAINER_RUNNING" || s.Status.LogPath != filepath.Join(pod.LogDirectory, "server.log") {
		t.Errorf("server: state %s, log %s", s.Status.State, s.Status.LogPath)
	}
	checkCRILog(t, s.Status.LogPath, map[string]string{"server up": "stdout", "to stderr": "stderr"})

	x.Stop(t, server, 0)
	if s := x.Inspect(t, server); s.Status.State != "CONTAINER_EXITED" {
		t.Errorf("server after stop: %s", s.Status.State)
	}
	x.Remove(t, server)
	x.StopPod(t, podID)
	x.RemovePod(t, podID)
	if out := x.MustRun("pods", "-q"); out != "" {
		t.Errorf("pods after rmp: %q", out)
	}
	if out := x.MustRun("ps", "-a", "-q"); out != "" {
		t.Errorf("containers after rmp: %q", out)
	}
	if left := c.WaitCRIClean(15 * time.Second); left != "" {
		t.Errorf("left after the pod was removed:\n%s", left)
	}
}

// checkCRILog checks that the log at path has, for each text of want, a
// full line of it on the stream want names, stamped with an RFC 3339
// time.
func checkCRILog(t *testing.T, path string, want map[string]string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("the container's log: %v", err)
		return
	}
	seen := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		m := criLogLine.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("log line %q is not in the CRI format", line)
			continue
		}
		if _, err := time.Parse(time.RFC3339Nano, m[1]); err != nil || m[3] != "F" {
			t.Errorf("log line %q: time %v, tag %s", line, err, m[3])
		}
		seen[m[4]] = m[2]
	}
	for text, stream := range want {
		if seen[text] != stream {
			t.Errorf("the log has %q on %q, want %s:\n%s", text, seen[text], stream, data)
		}
	}
}
