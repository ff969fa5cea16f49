package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// criContainerd starts a containerd of version with its CRI on, whose
// cocoon handler's shims keep their state under the test's directory, as
// shimContainerd's do; the test fails if a sandbox's state, QEMU,
// virtiofsd or mount is left when it ends.
func criContainerd(t *testing.T, version string) (*harness.Containerd, string) {
	t.Helper()
	root := t.TempDir()
	stateDir := filepath.Join(root, "run")
	cfg := filepath.Join(root, "config.toml")
	if err := os.WriteFile(cfg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	kv := []string{"COCOON_CONFIG=" + cfg, "COCOON_STATE_DIR=" + stateDir, "COCOON_DATA_DIR=" + filepath.Join(root, "lib"), "COCOON_TEMPLATE=never",
		"COCOON_IMAGE_DIR=" + testEnv.imageDir}
	t.Cleanup(func() { assertClean(t, stateDir) })
	return harness.StartContainerd(t, version, harness.WithEnv(kv...), harness.WithCRI(harness.CRIConfig{})), stateDir
}

// TestCRIPod is TestCRIRunc's pod with Cocoon: two containers reach each
// other on the pod's loopback, exec and exec -s, logs in CRI's format at
// CRI's path, stop and removal, and nothing left on the host.
func TestCRIPod(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, _ := criContainerd(t, v)
			runTwoContainerPod(t, c, harness.CocoonRuntimeHandler)
		})
	}
}

// TestCRIPodOneVM checks what makes a Cocoon pod one VM: its containers
// see one guest kernel (not the host's) and one /etc/hosts, hostPath
// volumes read-write and read-only reach them, each has a
// root filesystem of its own, they share the pod's /dev/shm and
// hostname; stats of a container and of the pod; crictl update reaches
// the guest's cgroup; a container whose
// memory passes its limit is OOMKilled; another one restarts in the pod
// as kubelet restarts one; and after rmp the pod's VM is gone.
func TestCRIPodOneVM(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, stateDir := criContainerd(t, v)
			x := harness.NewCrictl(t, c)
			img := harness.ImportBusyboxCRI(t, c)
			pod := x.PodConfig("onevm")
			podID := x.RunPod(t, pod, harness.CocoonRuntimeHandler)
			qemus := qemuOf(t, stateDir)
			if len(qemus) != 1 {
				t.Fatalf("QEMU processes of the pod: %v, want one", qemus)
			}
			checkPodCgroup(t, c, podID, qemus[0])

			// hostPath volumes, read-write and read-only.
			vol, roVol := t.TempDir(), t.TempDir()
			if err := os.WriteFile(filepath.Join(roVol, "config"), []byte("from the host\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			aCfg := x.ContainerConfig("a", img, "sleep", "3600")
			aCfg.Mounts = []harness.Mount{{ContainerPath: "/data", HostPath: vol}, {ContainerPath: "/config", HostPath: roVol, Readonly: true}}
			a := x.CreateContainer(t, podID, aCfg, pod)
			x.Start(t, a)
			x.ExecSync(t, a, "sh", "-c", "echo from the pod > /data/out")
			if got, err := os.ReadFile(filepath.Join(vol, "out")); err != nil || string(got) != "from the pod\n" {
				t.Errorf("the hostPath volume on the host: %q, %v", got, err)
			}
			if got := x.ExecSync(t, a, "cat", "/config/config"); strings.TrimSpace(got) != "from the host" {
				t.Errorf("the read-only volume in the pod: %q", got)
			}
			if out, _, err := x.Run("exec", "-s", a, "sh", "-c", "echo x > /config/new"); err == nil {
				t.Errorf("a wrote to its read-only volume: %q", out)
			}
			b := x.CreateContainer(t, podID, x.ContainerConfig("b", img, "sleep", "3600"), pod)
			x.Start(t, b)
			if got := qemuOf(t, stateDir); len(got) != 1 || got[0] != qemus[0] {
				t.Errorf("QEMU processes with two containers: %v, want %v", got, qemus)
			}

			hostBoot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
			bootA := x.ExecSync(t, a, "cat", "/proc/sys/kernel/random/boot_id")
			bootB := x.ExecSync(t, b, "cat", "/proc/sys/kernel/random/boot_id")
			if strings.TrimSpace(bootA) != strings.TrimSpace(bootB) || strings.TrimSpace(bootA) == strings.TrimSpace(string(hostBoot)) {
				t.Errorf("boot ids: a %q, b %q, host %q: want one guest kernel, not the host's", bootA, bootB, hostBoot)
			}
			if r := strings.TrimSpace(x.ExecSync(t, a, "uname", "-r")); !strings.HasSuffix(r, "-cocoon") {
				t.Errorf("a runs on kernel %q, want the guest's", r)
			}

			// One /etc/hosts: what a writes, b reads, and so does the
			// host's file CRI made.
			x.ExecSync(t, a, "sh", "-c", "echo '10.9.9.9 written-by-a' >> /etc/hosts")
			if hosts := x.ExecSync(t, b, "cat", "/etc/hosts"); !strings.Contains(hosts, "written-by-a") {
				t.Errorf("b's /etc/hosts has not a's line:\n%s", hosts)
			}
			// Roots of their own.
			x.ExecSync(t, a, "sh", "-c", "echo mine > /only-in-a")
			if out, _, err := x.Run("exec", "-s", b, "cat", "/only-in-a"); err == nil {
				t.Errorf("b reads a's root filesystem: %q", out)
			}
			// One /dev/shm and the pod's hostname.
			x.ExecSync(t, a, "sh", "-c", "echo shared > /dev/shm/from-a")
			if got := strings.TrimSpace(x.ExecSync(t, b, "cat", "/dev/shm/from-a")); got != "shared" {
				t.Errorf("b's /dev/shm/from-a: %q", got)
			}
			if h := strings.TrimSpace(x.ExecSync(t, b, "hostname")); h != "onevm" {
				t.Errorf("b's hostname %q, want the pod's", h)
			}

			checkCRIStats(t, x, a, podID)

			// UpdateContainerResources reaches the container's cgroup in
			// the guest.
			x.MustRun("update", "--memory", "104857600", b)
			if got := strings.TrimSpace(x.ExecSync(t, b, "sh", "-c", "cat /sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory.max")); got != "104857600" {
				t.Errorf("b's memory.max after crictl update: %q, want 104857600", got)
			}

			// OOM: the guest's kernel kills the container's process;
			// CRI reports the reason.
			oomCfg := x.ContainerConfig("oom", img, "sh", "-c", "tail /dev/zero")
			oomCfg.Linux = &harness.ContainerLinux{Resources: &harness.Resources{MemoryLimitInBytes: 32 << 20}}
			oom := x.CreateContainer(t, podID, oomCfg, pod)
			x.Start(t, oom)
			st := waitExited(t, x, oom, 60*time.Second)
			if st.Reason != "OOMKilled" || st.ExitCode != 137 {
				t.Errorf("the OOM container: reason %q, exit code %d; want OOMKilled, 137", st.Reason, st.ExitCode)
			}
			// The VM is still the pod's: b still runs.
			if got := strings.TrimSpace(x.ExecSync(t, b, "echo", "alive")); got != "alive" {
				t.Errorf("b after the OOM kill: %q", got)
			}

			// A restart as kubelet does it: a new container of the same
			// name with the next attempt, in the same VM.
			x.Stop(t, a, 0)
			x.Remove(t, a)
			again := x.ContainerConfig("a", img, "sleep", "3600")
			again.Metadata.Attempt = 1
			a2 := x.CreateContainer(t, podID, again, pod)
			x.Start(t, a2)
			if boot := x.ExecSync(t, a2, "cat", "/proc/sys/kernel/random/boot_id"); strings.TrimSpace(boot) != strings.TrimSpace(bootB) {
				t.Errorf("the restarted container runs in another kernel: %q, want %q", boot, bootB)
			}
			if _, _, err := x.Run("exec", "-s", a2, "cat", "/only-in-a"); err == nil {
				t.Error("the restarted container has the old one's root filesystem")
			}

			x.StopPod(t, podID)
			x.RemovePod(t, podID)
			for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && len(qemuOf(t, stateDir)) > 0; {
				time.Sleep(200 * time.Millisecond)
			}
			if left := qemuOf(t, stateDir); len(left) > 0 {
				t.Errorf("QEMU after rmp: %v", left)
			}
			if left := c.WaitCRIClean(15 * time.Second); left != "" {
				t.Errorf("left after the pod was removed:\n%s", left)
			}
		})
	}
}

// qemuOf lists the pids of the QEMU processes whose state is under
// stateDir.
func qemuOf(t *testing.T, stateDir string) []string {
	t.Helper()
	out, err := exec.Command("pgrep", "-f", "qemu-system.*"+stateDir).Output()
	if err != nil {
		return nil
	}
	return strings.Fields(string(out))
}

// waitExited waits until container id has exited and returns its status.
func waitExited(t *testing.T, x *harness.Crictl, id string, timeout time.Duration) harness.ContainerStatus {
	t.Helper()
	var st harness.ContainerStatus
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if st = x.Inspect(t, id).Status; st.State == "CONTAINER_EXITED" {
			return st
		}
	}
	t.Fatalf("container %s has not exited after %v: %s", id, timeout, st.State)
	return st
}

// checkCRIStats checks crictl stats of container id (its guest cgroup's
// memory and CPU) and statsp of the pod.
func checkCRIStats(t *testing.T, x *harness.Crictl, id, podID string) {
	t.Helper()
	var stats struct {
		Stats []struct {
			CPU struct {
				UsageCoreNanoSeconds struct {
					Value string `json:"value"`
				} `json:"usageCoreNanoSeconds"`
			} `json:"cpu"`
			Memory struct {
				WorkingSetBytes struct {
					Value string `json:"value"`
				} `json:"workingSetBytes"`
			} `json:"memory"`
		} `json:"stats"`
	}
	out := x.MustRun("stats", "-o", "json", "--id", id)
	if err := json.Unmarshal([]byte(out), &stats); err != nil || len(stats.Stats) != 1 {
		t.Fatalf("crictl stats: %v:\n%s", err, out)
	}
	s := stats.Stats[0]
	if positive(s.CPU.UsageCoreNanoSeconds.Value) != nil || positive(s.Memory.WorkingSetBytes.Value) != nil {
		t.Errorf("crictl stats: cpu %q ns, working set %q bytes; want both above 0:\n%s", s.CPU.UsageCoreNanoSeconds.Value, s.Memory.WorkingSetBytes.Value, out)
	}
	// The pod's stats are its cgroup's on the host, which holds the VM:
	// QEMU alone has more than 64 MiB resident.
	var pod struct {
		Stats []struct {
			Linux struct {
				Memory struct {
					WorkingSetBytes struct {
						Value string `json:"value"`
					} `json:"workingSetBytes"`
				} `json:"memory"`
			} `json:"linux"`
		} `json:"stats"`
	}
	out, errOut, err := x.Run("statsp", "-o", "json", "--id", podID)
	if err != nil || json.Unmarshal([]byte(out), &pod) != nil || len(pod.Stats) != 1 {
		t.Fatalf("crictl statsp: %v %s:\n%s", err, errOut, out)
	}
	var ws uint64
	if _, err := fmt.Sscan(pod.Stats[0].Linux.Memory.WorkingSetBytes.Value, &ws); err != nil || ws < 64<<20 {
		t.Errorf("crictl statsp: the pod's working set is %q bytes, want more than 64 MiB (the VM's):\n%s", pod.Stats[0].Linux.Memory.WorkingSetBytes.Value, out)
	}
}

// checkPodCgroup checks that the pod's QEMU is in the pod sandbox's
// cgroup on the host (<cgroup parent>/<pod id>), whose memory limit is
// the VM's memory (256 MiB by default) and the host's overhead (128 MiB).
func checkPodCgroup(t *testing.T, c *harness.Containerd, podID, qemuPID string) {
	t.Helper()
	want := c.CRICgroupParent() + "/" + podID
	data, err := os.ReadFile("/proc/" + qemuPID + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	memory := ""
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[1] == "memory" || parts[0] == "0" && memory == "") {
			if parts[1] == "memory" {
				memory = filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes")
			} else {
				memory = filepath.Join("/sys/fs/cgroup", parts[2], "memory.max")
			}
			if parts[2] != want {
				t.Errorf("QEMU is in cgroup %s (%s), want the pod's %s", parts[2], line, want)
			}
		}
	}
	limit, err := os.ReadFile(memory)
	if err != nil {
		t.Fatalf("the pod cgroup's memory limit: %v", err)
	}
	if got := strings.TrimSpace(string(limit)); got != fmt.Sprint((256+128)<<20) {
		t.Errorf("%s = %s, want %d (256 MiB of guest and 128 MiB of host overhead)", memory, got, (256+128)<<20)
	}
}

// positive is nil if s is a whole number above 0.
func positive(s string) error {
	var n uint64
	if _, err := fmt.Sscan(s, &n); err != nil || n == 0 {
		return fmt.Errorf("%q is not above 0", s)
	}
	return nil
}
