package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// TestDocker drives Cocoon through a real Docker Engine (moby v2, with
// containerd 1.6 and 2.4 under it) and the docker CLI, as a user of
// `docker run --runtime cocoon` would. Docker puts the container's
// interface into its namespace after the task's Create (the spare NIC,
// docs/networking.md) and binds its own /etc/hosts, /etc/hostname and
// /etc/resolv.conf (virtio-fs). A container serves HTTP on a published
// port to the host, with a read-only volume and a read-write --mount;
// the guest has the address docker inspect reports; exec, logs, top,
// stats, pause and unpause, commit and diff of a running container's
// writes, cp out of a paused and a stopped one and into a created one; stop with its SIGTERM, kill, restart; and
// after rm -f and the daemon's stop nothing is left.
func TestDocker(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, _, _ := shimContainerd(t, v)
			d := harness.NewDocker(t, c)
			img := d.ImportBusybox(t)
			rt := "--runtime=" + harness.DockerCocoonRuntime

			if out := d.Run(t, "run", "--rm", rt, img, "uname", "-r"); !strings.Contains(out, "cocoon") {
				t.Errorf("docker run --rm uname -r: %q, want the guest's kernel", out)
			}

			www := t.TempDir()
			if err := os.WriteFile(filepath.Join(www, "index.html"), []byte("hello-from-cocoon\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			data := t.TempDir()
			port := freeTCPPort(t)
			d.Run(t, "run", "-d", "--name", "web", rt, "-p", fmt.Sprintf("127.0.0.1:%d:80", port), "-v", www+":/www:ro", "--mount", "type=bind,src="+data+",dst=/data", img,
				"sh", "-c", "echo serving; trap 'echo stopping; exit 0' TERM; httpd -f -p 80 -h /www & wait")
			if body := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/index.html", port)); body != "hello-from-cocoon\n" {
				t.Errorf("the published port answered %q", body)
			}
			ip := strings.TrimSpace(d.Run(t, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", "web"))
			if addr := d.Run(t, "exec", "web", "ip", "-4", "-o", "addr", "show", "eth0"); ip == "" || !strings.Contains(addr, " "+ip+"/") {
				t.Errorf("docker inspect says %q; the guest's eth0: %q", ip, addr)
			}
			if out, _, err := d.RunErr("exec", "web", "touch", "/www/x"); err == nil {
				t.Errorf("a write to the read-only volume succeeded: %q", out)
			}
			d.Run(t, "exec", "web", "sh", "-c", "echo from-guest > /data/f")
			if b, err := os.ReadFile(filepath.Join(data, "f")); err != nil || string(b) != "from-guest\n" {
				t.Errorf("the --mount bind's file on the host: %q, %v", b, err)
			}
			if out := d.Run(t, "exec", "web", "cat", "/etc/hostname"); strings.TrimSpace(out) == "" {
				t.Error("the container's /etc/hostname (Docker's bind) is empty")
			}
			waitDockerLogs(t, d, "web", "serving")
			pid := strings.TrimSpace(d.Run(t, "inspect", "-f", "{{.State.Pid}}", "web"))
			if comm, err := os.ReadFile("/proc/" + pid + "/comm"); err != nil || !strings.HasPrefix(string(comm), "qemu-system") {
				t.Errorf("docker inspect's pid %s is %q (%v), want the sandbox's QEMU", pid, comm, err)
			}
			if top := d.Run(t, "top", "web"); !strings.Contains(top, "qemu-system") {
				t.Errorf("docker top lists no QEMU for the init:\n%s", top)
			}
			if stats := d.Run(t, "stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}} {{.PIDs}}", "web"); !regexp.MustCompile(`^web \d+(\.\d+)?[KM]iB / `).MatchString(stats) {
				t.Errorf("docker stats: %q", stats)
			}

			// A running container's writes reach commit and diff: pause
			// (which commit does first) sends the guest's writable layer
			// back to the host.
			d.Run(t, "exec", "web", "sh", "-c", "echo written-in-guest > /tmp/w.txt")
			d.Run(t, "pause", "web")
			if st := d.Run(t, "inspect", "-f", "{{.State.Status}}", "web"); strings.TrimSpace(st) != "paused" {
				t.Errorf("after pause: %q", st)
			}
			paused := filepath.Join(t.TempDir(), "paused.txt")
			d.Run(t, "cp", "web:/tmp/w.txt", paused)
			if b, err := os.ReadFile(paused); err != nil || string(b) != "written-in-guest\n" {
				t.Errorf("docker cp out of the paused container: %q, %v", b, err)
			}
			d.Run(t, "unpause", "web")
			d.Run(t, "commit", "web", "cocoon-test/committed:1")
			if out := d.Run(t, "run", "--rm", rt, "--network", "none", "cocoon-test/committed:1", "cat", "/tmp/w.txt"); out != "written-in-guest\n" {
				t.Errorf("the committed image's /tmp/w.txt: %q", out)
			}
			if diff := d.Run(t, "diff", "web"); !strings.Contains(diff, "A /tmp/w.txt") {
				t.Errorf("docker diff lacks the guest's write:\n%s", diff)
			}

			// stop sends SIGTERM, which the container traps.
			d.Run(t, "stop", "web")
			if code := strings.TrimSpace(d.Run(t, "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", "web")); code != "exited 0" {
				t.Errorf("after stop: %q, want exited 0", code)
			}
			waitDockerLogs(t, d, "web", "stopping")
			out := filepath.Join(t.TempDir(), "w.txt")
			d.Run(t, "cp", "web:/tmp/w.txt", out)
			if b, err := os.ReadFile(out); err != nil || string(b) != "written-in-guest\n" {
				t.Errorf("docker cp out of the stopped container: %q, %v", b, err)
			}
			// restart boots a new VM on the same root and network.
			d.Run(t, "restart", "web")
			if body := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/index.html", port)); body != "hello-from-cocoon\n" {
				t.Errorf("after restart the published port answered %q", body)
			}
			if got := d.Run(t, "exec", "web", "cat", "/tmp/w.txt"); got != "written-in-guest\n" {
				t.Errorf("after restart /tmp/w.txt: %q", got)
			}
			d.Run(t, "kill", "web")
			if code := strings.TrimSpace(d.Run(t, "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", "web")); code != "exited 137" {
				t.Errorf("after kill: %q, want exited 137", code)
			}

			// cp into a created container: its root's upper layer seeds
			// the guest's writable layer at start.
			d.Run(t, "create", "--name", "cpin", rt, "--network", "none", img, "cat", "/in.txt")
			in := filepath.Join(t.TempDir(), "in.txt")
			if err := os.WriteFile(in, []byte("copied-in\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			d.Run(t, "cp", in, "cpin:/in.txt")
			if got := d.Run(t, "start", "-a", "cpin"); got != "copied-in\n" {
				t.Errorf("docker cp into a created container, then start -a: %q", got)
			}

			d.Run(t, "rm", "-f", "web", "cpin")
			dockerDone(t, d)
		})
	}
}

// TestDockerFeatures runs Docker's per-container options with Cocoon on
// containerd 2.4, each next to runc where the two differ: --user,
// --read-only, -it, --init, the runtime entry whose options name a
// configuration file, --memory and --cpus (the guest's cgroup and the VM's
// size) and docker update, an OOM kill, an exit code, a healthcheck,
// --network none, a user-defined network (and its embedded DNS, which
// the guest does not reach), and --network host,
// --privileged and --network container: refused by name.
func TestDockerFeatures(t *testing.T) {
	c, _, _ := shimContainerd(t, "2.4")
	d := harness.NewDocker(t, c)
	img := d.ImportBusybox(t)
	rt := "--runtime=" + harness.DockerCocoonRuntime

	if out := d.Run(t, "run", "--rm", rt, "--network", "none", "--user", "1000:1000", img, "id"); !strings.HasPrefix(out, "uid=1000 gid=1000") {
		t.Errorf("--user 1000:1000: %q", out)
	}
	if _, stderr, err := d.RunErr("run", "--rm", rt, "--network", "none", "--read-only", img, "touch", "/x"); err == nil || !strings.Contains(stderr, "Read-only file system") {
		t.Errorf("--read-only: a write to / gave %v: %q", err, stderr)
	}
	if _, _, err := d.RunErr("run", "--rm", rt, "--network", "none", img, "sh", "-c", "exit 3"); exitCode(err) != 3 {
		t.Errorf("exit 3: docker run returned %v", err)
	}

	// -it: the CLI wants a terminal on its stdin; the container gets one
	// of the guest's, of the client's size.
	out, err := runOnPty(t, d.Command(context.Background(), "run", "--rm", "-it", rt, "--network", "none", img, "sh", "-c", "tty; echo size=$(stty size)"), 27, 91)
	if err != nil || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "size=27 91") {
		t.Errorf("run -it: %v, the container's terminal: %q", err, out)
	}
	// --init: Docker's init (tini, bound from the host) is PID 1 and
	// runs the command as its child.
	if out := d.Run(t, "run", "--rm", rt, "--network", "none", "--init", img, "sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '; echo; echo $$"); !strings.HasPrefix(out, "/sbin/docker-init -- sh") || strings.HasSuffix(out, "\n1\n") {
		t.Errorf("--init: PID 1's command line and the shell's pid: %q", out)
	}

	// The runtime whose options name a configuration file: its VMs are
	// made from that file, the other runtime's from the environment's.
	if err := os.WriteFile(d.RuntimeConfig, []byte("[hypervisor]\nmemory_mib = 384\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	memTotal := `sed -n 's/MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo`
	for r, atLeast := range map[string]int{harness.DockerCocoonConfigPathRuntime: 300 << 10, harness.DockerCocoonRuntime: 0} {
		kb, _ := strconv.Atoi(strings.TrimSpace(d.Run(t, "run", "--rm", "--runtime="+r, "--network", "none", img, "sh", "-c", memTotal)))
		if kb < atLeast || (atLeast == 0 && kb >= 300<<10) {
			t.Errorf("--runtime %s: the VM has %d KiB (its file says memory_mib = 384: %v)", r, kb, atLeast > 0)
		}
	}

	// Limits: the container's cgroup in the guest, and a VM that holds
	// them; docker update reaches the same cgroup.
	d.Run(t, "run", "-d", "--name", "lim", rt, "--network", "none", "--memory", "512m", "--cpus", "2", img, "sleep", "600")
	cg := `p=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup); cat $p/memory.max $p/cpu.max; nproc; sed -n 's/MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo`
	got := strings.Fields(d.Run(t, "exec", "lim", "sh", "-c", cg))
	if len(got) != 5 || got[0] != strconv.Itoa(512<<20) || got[1] != "200000" || got[2] != "100000" || got[3] != "2" {
		t.Errorf("--memory 512m --cpus 2: memory.max, cpu.max, nproc, MemTotal = %q", got)
	} else if kb, _ := strconv.Atoi(got[4]); kb < 512<<10 {
		t.Errorf("the VM has %d KiB, less than the container's 512 MiB limit", kb)
	}
	d.Run(t, "update", "--memory", "256m", "--memory-swap", "256m", "--cpus", "0.5", "lim")
	got = strings.Fields(d.Run(t, "exec", "lim", "sh", "-c", cg))
	if len(got) != 5 || got[0] != strconv.Itoa(256<<20) || got[1] != "50000" {
		t.Errorf("after docker update --memory 256m --cpus 0.5: %q", got)
	}
	d.Run(t, "rm", "-f", "lim")

	if _, _, err := d.RunErr("run", "--name", "oom", rt, "--network", "none", "--memory", "32m", img, "sh", "-c", "x=a; while :; do x=$x$x; done"); exitCode(err) != 137 {
		t.Errorf("OOM: docker run returned %v, want exit 137", err)
	}
	if st := strings.TrimSpace(d.Run(t, "inspect", "-f", "{{.State.OOMKilled}} {{.State.ExitCode}}", "oom")); st != "true 137" {
		t.Errorf("OOMKilled, ExitCode = %q, want true 137", st)
	}
	d.Run(t, "rm", "oom")

	d.Run(t, "run", "-d", "--name", "hc", rt, "--network", "none", "--health-cmd", "test -e /tmp/ok", "--health-interval", "1s",
		img, "sh", "-c", "sleep 1; touch /tmp/ok; exec sleep 600")
	var health string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if health = strings.TrimSpace(d.Run(t, "inspect", "-f", "{{.State.Health.Status}}", "hc")); health == "healthy" {
			break
		}
	}
	if health != "healthy" {
		t.Errorf("healthcheck: %q after 60 s", health)
	}

	// --network none: loopback and the spare NIC, down, with no address;
	// runc's container has loopback only.
	for _, r := range []string{rt, "--runtime=runc"} {
		links := d.Run(t, "run", "--rm", r, "--network", "none", img, "sh", "-c", "ip -o addr | grep -v ' lo '; ip -o link | grep -c UP")
		if strings.TrimSpace(links) != "1" {
			t.Errorf("%s --network none: addresses besides lo, or links up besides it: %q", r, links)
		}
	}
	// What is outside the VM is refused by name.
	for _, tc := range []struct{ flag, want string }{{"--network=host", "--net=host"}, {"--privileged", "privileged"}} {
		if _, stderr, err := d.RunErr("run", "--rm", rt, tc.flag, img, "true"); err == nil || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: %v, %q; want a refusal naming %s", tc.flag, err, stderr, tc.want)
		}
	}
	// --network container:<id> would mirror one namespace into two VMs,
	// or take a runc container's interfaces from it.
	if _, stderr, err := d.RunErr("run", "--rm", rt, "--network", "container:hc", img, "true"); err == nil || !strings.Contains(stderr, "mirrored into another VM") {
		t.Errorf("--network container:hc: %v, %q", err, stderr)
	}
	d.Run(t, "rm", "-f", "hc")
	d.Run(t, "run", "-d", "--name", "rc", "--runtime=runc", img, "sleep", "600")
	if _, stderr, err := d.RunErr("run", "--rm", rt, "--network", "container:rc", img, "true"); err == nil || !strings.Contains(stderr, "--network container:<id>") {
		t.Errorf("--network container:rc (runc's): %v, %q", err, stderr)
	}
	d.Run(t, "rm", "-f", "rc")

	// A user-defined network (its subnet from the daemon's pool): a
	// container reaches a peer on it by the address docker inspect gives.
	d.Run(t, "network", "create", "cocoon-net")
	d.Run(t, "run", "-d", "--name", "peer", rt, "--network", "cocoon-net", img, "sh", "-c", "echo peer-page > /index.html; exec httpd -f -p 8080 -h /")
	peer := strings.TrimSpace(d.Run(t, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", "peer"))
	if out := d.Run(t, "run", "--rm", rt, "--network", "cocoon-net", img, "sh", "-c",
		"for i in $(seq 30); do nc "+peer+" 8080 </dev/null >/dev/null 2>&1 && break; sleep 1; done; printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc "+peer+" 8080"); !strings.Contains(out, "peer-page") {
		t.Errorf("a container on cocoon-net fetched from peer at %s: %q", peer, out)
	}
	// Docker's embedded DNS (127.0.0.11) answers in the container's
	// namespace on the host, which the guest's loopback is not: the peer's
	// name resolves under runc only (docs/docker.md, Limits).
	for r, resolves := range map[string]bool{"--runtime=runc": true, rt: false} {
		_, _, err := d.RunErr("run", "--rm", r, "--network", "cocoon-net", img, "timeout", "10", "nslookup", "peer")
		if (err == nil) != resolves {
			t.Errorf("%s: nslookup peer through Docker's embedded DNS: %v, want resolved %v", r, err, resolves)
		}
	}
	d.Run(t, "rm", "-f", "peer")
	d.Run(t, "network", "rm", "cocoon-net")

	dockerDone(t, d)
}
