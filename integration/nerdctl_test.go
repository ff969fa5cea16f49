package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// hostGet fetches url from the host, trying for 30 s, and returns the
// body; "" (with the test failed) if it never answers.
func hostGet(t *testing.T, url string) string {
	t.Helper()
	var out []byte
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err = exec.CommandContext(ctx, "busybox", "wget", "-q", "-O", "-", url).CombinedOutput()
		cancel()
		if err == nil {
			return strings.TrimSpace(string(out))
		}
	}
	t.Errorf("wget %s from the host: %v: %s", url, err, out)
	return ""
}

// TestNerdctl drives real nerdctl and CNI (Debian's plugins) against the
// runtime, as a user of runc would: nerdctl's createRuntime hook runs
// CNI in the namespace the shim made, the VM mirrors it, and the
// published port, the names in /etc/hosts, IPv6, bind mounts, --network
// none, commit and a failing hook behave as with runc. After rm -f no
// tap, redirect, virtiofsd, holder, namespace or mount is left.
func TestNerdctl(t *testing.T) {
	for i, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, stateDir := shimContainerd(t, v)
			n := harness.NewNerdctl(t, c)
			net := n.MustCreateNetwork("--subnet", fmt.Sprintf("10.211.%d.0/24", i), "--ipv6", "--subnet", fmt.Sprintf("fd02:%d::/64", i+1))
			port := 18180 + i
			data, ro := t.TempDir(), t.TempDir()
			if err := os.WriteFile(filepath.Join(ro, "f"), []byte("read-only\n"), 0o644); err != nil {
				t.Fatal(err)
			}

			n.MustRun("run", "-d", "--name", "web", "--net", net, "-p", fmt.Sprintf("127.0.0.1:%d:80", port),
				"-v", data+":/data", "-v", ro+":/ro:ro", "--memory", "512m", "--cpus", "2", "-e", "GREETING=hello-from-the-vm", "-w", "/www",
				img, "sh", "-c", `mkdir -p /www && echo "$GREETING" > /www/index.html && echo from-the-guest > /data/out && exec httpd -f -p 80 -h /www`)
			if body := hostGet(t, fmt.Sprintf("http://127.0.0.1:%d/index.html", port)); body != "hello-from-the-vm" {
				t.Errorf("the published port answered %q", body)
			}
			if got, err := os.ReadFile(filepath.Join(data, "out")); err != nil || string(got) != "from-the-guest\n" {
				t.Errorf("the read-write bind on the host: %q, %v", got, err)
			}
			if out, _, err := n.Run("exec", "web", "sh", "-c", "echo x > /ro/f"); err == nil {
				t.Errorf("a write to the read-only bind succeeded: %s", out)
			}
			ifs := n.MustRun("exec", "web", "sh", "-c", "ls /sys/class/net; ip -6 addr show eth0; pwd; f=/sys/fs/cgroup/memory.max; [ -e $f ] || f=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/memory.max; cat $f; c=/sys/fs/cgroup/cpu.max; [ -e $c ] || c=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/cpu.max; cat $c")
			for _, want := range []string{"eth0", fmt.Sprintf("inet6 fd02:%d::", i+1), "/www", "536870912", "200000 100000"} {
				if !strings.Contains(ifs, want) {
					t.Errorf("the container lacks %q:\n%s", want, ifs)
				}
			}
			// The VM is sized for the limits, which are more than the
			// configured 1 vCPU and 256 MiB: 2 vCPUs, 512 MiB and the
			// guest's overhead.
			var cpus, memKB int
			if _, err := fmt.Sscanf(n.MustRun("exec", "web", "sh", "-c", "nproc; sed -n 's/MemTotal: *//p' /proc/meminfo"), "%d\n%d", &cpus, &memKB); err != nil || cpus != 2 || memKB < 530000 {
				t.Errorf("the VM has %d vCPUs and %d kB (%v): want 2 and more than the 512 MiB limit", cpus, memKB, err)
			}

			// A second container on the bridge reaches the first by name
			// (nerdctl's /etc/hosts) and by address.
			ip := strings.TrimSpace(n.MustRun("inspect", "-f", "{{.NetworkSettings.IPAddress}}", "web"))
			if !strings.HasPrefix(ip, fmt.Sprintf("10.211.%d.", i)) {
				t.Errorf("nerdctl inspect gives web the address %q", ip)
			}
			for _, host := range []string{"web", ip} {
				out, errOut, err := n.Run("run", "--rm", "--net", net, img, "wget", "-q", "-O", "-", "http://"+host+"/index.html")
				if err != nil || strings.TrimSpace(out) != "hello-from-the-vm" {
					t.Errorf("from a peer, http://%s/: %q %v\n%s", host, out, err, errOut)
				}
			}

			// commit sees what the running container wrote.
			n.MustRun("exec", "web", "sh", "-c", "echo committed > /www/marker")
			n.MustRun("commit", "web", "cocoon/committed:test")
			if out := n.MustRun("run", "--rm", "--net", "none", "cocoon/committed:test", "cat", "/www/marker"); strings.TrimSpace(out) != "committed" {
				t.Errorf("the committed image's file: %q", out)
			}

			// Two networks: two interfaces, each with its network's address.
			net2 := n.MustCreateNetwork("--subnet", fmt.Sprintf("10.212.%d.0/24", i))
			if out := n.MustRun("run", "--rm", "--net", net, "--net", net2, img, "ip", "-o", "-4", "addr"); !strings.Contains(out, fmt.Sprintf("eth0    inet 10.211.%d.", i)) || !strings.Contains(out, fmt.Sprintf("eth1    inet 10.212.%d.", i)) {
				t.Errorf("a container on two networks:\n%s", out)
			}
			// --net=host: the host's namespace is outside the VM.
			if _, errOut, err := n.Run("run", "--rm", "--net", "host", img, "true"); err == nil || !strings.Contains(errOut, "--net=host") {
				t.Errorf("run --net host: %v\n%s\nwant a refusal naming --net=host", err, errOut)
			}

			// --network none: loopback only.
			if out := n.MustRun("run", "--rm", "--net", "none", img, "ls", "/sys/class/net"); strings.Fields(out)[0] != "lo" || len(strings.Fields(out)) != 1 {
				t.Errorf("interfaces with --network none: %q", out)
			}

			// A createRuntime hook that fails (CNI's host-local refuses an
			// address outside the subnet) fails the run with its message.
			_, errOut, err := n.Run("run", "--rm", "--net", net, "--ip", "10.99.99.99", img, "true")
			if err == nil || !strings.Contains(errOut, "createRuntime") || !strings.Contains(errOut, "10.99.99.99") {
				t.Errorf("run with an address CNI refuses: %v\n%s\nwant the createRuntime hook's failure", err, errOut)
			}

			n.MustRun("rm", "-f", "web")
			c.WaitNoShim(t)
			if left := n.Leftovers(stateDir); left != "" {
				t.Errorf("left on the host after nerdctl rm -f:\n%s", left)
			}
		})
	}
}

// TestNerdctlLifecycle: nerdctl's everyday commands on a container in a
// VM: run attached and with a terminal, --user, logs, ps, stop, start
// again, exec, and rm.
func TestNerdctlLifecycle(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, stateDir := shimContainerd(t, v)
			n := harness.NewNerdctl(t, c)
			if out := n.MustRun("run", "--rm", "--net", "none", "--user", "1000:1000", img, "sh", "-c", "echo attached; id -u; id -g"); strings.Join(strings.Fields(out), " ") != "attached 1000 1000" {
				t.Errorf("run attached as 1000:1000: %q", out)
			}
			// -it: nerdctl wants a terminal on its stdin.
			out, err := runOnPty(t, n.Command(context.Background(), "run", "--rm", "-it", "--net", "none", img, "sh", "-c", "tty; echo cols=$(stty size)"), 24, 80)
			if err != nil {
				t.Errorf("run -it: %v", err)
			}
			if !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "cols=24 80") {
				t.Errorf("run -it: the container's terminal: %q", out)
			}

			n.MustRun("run", "-d", "--name", "life", "--net", "none", img, "sh", "-c", "echo started; trap 'echo stopping; exit 0' TERM; while :; do sleep 1; done")
			if out := n.MustRun("ps", "--format", "{{.Names}} {{.Status}}"); !strings.Contains(out, "life Up") {
				t.Errorf("nerdctl ps: %q", out)
			}
			waitLogs(t, n, "life", "started")
			if out := n.MustRun("exec", "life", "echo", "exec-ok"); strings.TrimSpace(out) != "exec-ok" {
				t.Errorf("exec: %q", out)
			}
			n.MustRun("stop", "life")
			if out := n.MustRun("ps", "-a", "--format", "{{.Names}} {{.Status}}"); !strings.Contains(out, "life Exited") {
				t.Errorf("nerdctl ps -a after stop: %q", out)
			}
			waitLogs(t, n, "life", "stopping")
			n.MustRun("start", "life")
			if out := n.MustRun("exec", "life", "echo", "again"); strings.TrimSpace(out) != "again" {
				t.Errorf("exec after start: %q", out)
			}
			n.MustRun("rm", "-f", "life")
			c.WaitNoShim(t)
			if left := n.Leftovers(stateDir); left != "" {
				t.Errorf("left on the host after nerdctl rm -f:\n%s", left)
			}
		})
	}
}

// waitLogs waits up to 30 s for nerdctl logs of id to show want.
func waitLogs(t *testing.T, n *harness.Nerdctl, id, want string) {
	t.Helper()
	waitShows(t, "nerdctl logs "+id, want, func() string {
		out, _, _ := n.Run("logs", id)
		return out
	})
}

// waitShows waits up to 30 s for what read returns to hold want; what
// names it in the failure.
func waitShows(t *testing.T, what, want string, read func() string) {
	t.Helper()
	var out string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		if out = read(); strings.Contains(out, want) {
			return
		}
	}
	t.Errorf("%s never showed %q: %q", what, want, out)
}
