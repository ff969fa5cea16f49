package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// TestCRISecurityContext checks that the pod's limits size its VM, and
// that a pod container's securityContext
// holds in the guest: its user, group and supplementary groups, a
// read-only root, the capabilities it keeps, and the runtime's default
// seccomp profile; that a privileged container is privileged in the
// guest (never with the host's devices); and that a pod on the host's
// network is refused, naming hostNetwork.
func TestCRISecurityContext(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, _ := criContainerd(t, v)
			x := harness.NewCrictl(t, c)
			img := harness.ImportBusyboxCRI(t, c)
			// The pod's limits size its VM: 512 MiB and 2 CPUs.
			pod := x.PodConfig("secctx")
			pod.Linux.Resources = &harness.Resources{MemoryLimitInBytes: 512 << 20, CPUQuota: 200000, CPUPeriod: 100000}
			podID := x.RunPod(t, pod, harness.CocoonRuntimeHandler)

			cfg := x.ContainerConfig("locked", img, "sleep", "3600")
			cfg.Linux = &harness.ContainerLinux{SecurityContext: &harness.ContainerSecurityContext{
				RunAsUser: &harness.Int64Value{Value: 1234}, RunAsGroup: &harness.Int64Value{Value: 2345},
				SupplementalGroups: []int64{3456}, ReadonlyRootfs: true,
				Capabilities: &harness.Capabilities{Drop: []string{"ALL"}, Add: []string{"NET_BIND_SERVICE"}},
				Seccomp:      &harness.SecurityProfile{},
			}}
			locked := x.CreateContainer(t, podID, cfg, pod)
			x.Start(t, locked)
			if got := strings.Fields(x.ExecSync(t, locked, "sh", "-c", "id -u; id -g; id -G")); len(got) < 3 || got[0] != "1234" || got[1] != "2345" || !slices.Contains(got[2:], "3456") {
				t.Errorf("id: %v, want uid 1234, gid 2345 and group 3456", got)
			}
			if n := strings.TrimSpace(x.ExecSync(t, locked, "nproc")); n != "2" {
				t.Errorf("the pod's VM has %s vCPUs, want 2 for its CPU limit", n)
			}
			var memKB int
			if _, err := fmt.Sscanf(statusField(x.ExecSync(t, locked, "cat", "/proc/meminfo"), "MemTotal"), "%d kB", &memKB); err != nil || memKB < 530000 {
				t.Errorf("the pod's VM has %d kB of memory (%v), want more than its 512 MiB limit", memKB, err)
			}
			if out, _, err := x.Run("exec", "-s", locked, "touch", "/written"); err == nil {
				t.Errorf("a read-only root was written: %q", out)
			}
			status := x.ExecSync(t, locked, "cat", "/proc/self/status")
			if bnd := statusField(status, "CapBnd"); bnd != "0000000000000400" {
				t.Errorf("CapBnd %q, want only CAP_NET_BIND_SERVICE (0x400)", bnd)
			}
			if sc := statusField(status, "Seccomp"); sc != "2" {
				t.Errorf("Seccomp %q, want 2 (a filter: containerd's default profile)", sc)
			}

			priv := x.ContainerConfig("priv", img, "sleep", "3600")
			priv.Linux = &harness.ContainerLinux{SecurityContext: &harness.ContainerSecurityContext{Privileged: true}}
			privPod := x.PodConfig("priv")
			privPod.Linux.SecurityContext = &harness.PodSecurityContext{Privileged: true}
			privID := x.RunPod(t, privPod, harness.CocoonRuntimeHandler)
			p := x.CreateContainer(t, privID, priv, privPod)
			x.Start(t, p)
			status = x.ExecSync(t, p, "cat", "/proc/self/status")
			// containerd gives a privileged container the capabilities
			// it has itself (here all but CAP_SYS_RESOURCE): check the
			// administrative ones.
			var eff uint64
			if _, err := fmt.Sscanf(statusField(status, "CapEff"), "%x", &eff); err != nil || eff&(1<<21) == 0 || eff&(1<<12) == 0 {
				t.Errorf("privileged: CapEff %q, want CAP_SYS_ADMIN and CAP_NET_ADMIN among them", statusField(status, "CapEff"))
			}
			if sc := statusField(status, "Seccomp"); sc != "0" {
				t.Errorf("privileged: Seccomp %q, want 0", sc)
			}
			// The guest's devices, not the host's: no disk of the host.
			if out := x.ExecSync(t, p, "sh", "-c", "ls /dev"); strings.Contains(out, "nvme") || strings.Contains(out, "kvm") {
				t.Errorf("privileged /dev has host devices:\n%s", out)
			}

			host := x.PodConfig("hostnet")
			host.Linux.SecurityContext = &harness.PodSecurityContext{NamespaceOptions: &harness.NamespaceOptions{Network: harness.NamespaceNode}}
			if _, errOut, err := x.Run("runp", "--runtime", harness.CocoonRuntimeHandler, writeJSON(t, host)); err == nil || !strings.Contains(errOut, "hostNetwork") {
				t.Errorf("a pod on the host's network: %v, %s; want a refusal naming hostNetwork", err, errOut)
			}
		})
	}
}

// statusField is the value of field in /proc/<pid>/status text.
func statusField(status, field string) string {
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// writeJSON writes v as JSON into a file of the test's and returns its
// path.
func writeJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
