package oci

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// hostSpec is what containerd's default spec (ctr run) looks like.
func hostSpec() *specs.Spec {
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args:            []string{"sh"},
			Cwd:             "/",
			ApparmorProfile: "cri-containerd.apparmor.d",
			SelinuxLabel:    "system_u:system_r:container_t:s0",
		},
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Hostname: "web",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts"},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm"},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue"},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs"},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup"},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/default/web",
			MountLabel:  "system_u:object_r:container_file_t:s0",
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace},
			},
			Devices: []specs.LinuxDevice{{Path: "/dev/null", Type: "c", Major: 1, Minor: 3}},
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				BlockIO: &specs.LinuxBlockIO{Weight: ptr(uint16(500))},
			},
		},
		Hooks: &specs.Hooks{
			StartContainer: []specs.Hook{{Path: "/usr/bin/in-container-hook"}},
		},
		Annotations: map[string]string{"io.cocoon.vcpus": "2"},
	}
}

func ptr[T any](v T) *T { return &v }

func TestGuestSpecTranslates(t *testing.T) {
	host := hostSpec()
	g, err := GuestSpec(host, "web")
	if err != nil {
		t.Fatal(err)
	}
	if g.Root == nil || g.Root.Path != "" || !g.Root.Readonly {
		t.Errorf("root %+v: want no path, read-only kept", g.Root)
	}
	if g.Linux.CgroupsPath != "" || g.Linux.MountLabel != "" {
		t.Errorf("cgroupsPath %q mountLabel %q: want both cleared", g.Linux.CgroupsPath, g.Linux.MountLabel)
	}
	if g.Process.ApparmorProfile != "" || g.Process.SelinuxLabel != "" {
		t.Errorf("labels kept: %+v", g.Process)
	}
	if !reflect.DeepEqual(g.Mounts, host.Mounts) || !reflect.DeepEqual(g.Linux.Namespaces, host.Linux.Namespaces) {
		t.Error("kernel filesystem mounts or namespaces changed")
	}
	if len(g.Hooks.StartContainer) != 1 || g.Annotations["io.cocoon.vcpus"] != "2" || g.Hostname != "web" {
		t.Errorf("kept parts lost: %+v", g)
	}
	// The host spec is untouched.
	if host.Root.Path != "rootfs" || host.Linux.CgroupsPath != "/default/web" || host.Process.ApparmorProfile == "" {
		t.Error("GuestSpec modified the host spec")
	}
	g.Mounts[0].Destination = "/changed"
	if host.Mounts[0].Destination != "/proc" {
		t.Error("guest spec shares memory with the host spec")
	}
}

func TestGuestSpecRefuses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		edit     func(s *specs.Spec)
		sentinel func(error) bool
		mention  string
	}{
		{"host network", func(s *specs.Spec) { s.Linux.Namespaces = dropNS(s.Linux.Namespaces, specs.NetworkNamespace) }, errdefs.IsNotImplemented, "--net=host"},
		{"host pid", func(s *specs.Spec) { s.Linux.Namespaces = dropNS(s.Linux.Namespaces, specs.PIDNamespace) }, errdefs.IsNotImplemented, "--pid=host"},
		{"host ipc", func(s *specs.Spec) { s.Linux.Namespaces = dropNS(s.Linux.Namespaces, specs.IPCNamespace) }, errdefs.IsNotImplemented, "--ipc=host"},
		{"no mount namespace", func(s *specs.Spec) { s.Linux.Namespaces = dropNS(s.Linux.Namespaces, specs.MountNamespace) }, errdefs.IsInvalidArgument, "mount namespace"},
		{"joined pidns", func(s *specs.Spec) { setNSPath(s, specs.PIDNamespace, "/proc/42/ns/pid") }, errdefs.IsNotImplemented, "/proc/42/ns/pid"},
		{"joined uts", func(s *specs.Spec) { setNSPath(s, specs.UTSNamespace, "/proc/42/ns/uts") }, errdefs.IsNotImplemented, "uts namespace"},
		{"relative bind source", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: "data", Options: []string{"rbind"}})
		}, errdefs.IsInvalidArgument, `mount /data: the bind mount's source "data"`},
		{"host filesystem", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/mnt", Type: "ext4", Source: "/dev/sdb1"})
		}, errdefs.IsNotImplemented, `"ext4"`},
		{"host device", func(s *specs.Spec) {
			s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229})
		}, errdefs.IsNotImplemented, "/dev/fuse"},
		{"standard path, other device", func(s *specs.Spec) {
			s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: "/dev/null", Type: "c", Major: 8, Minor: 0})
		}, errdefs.IsNotImplemented, "/dev/null (c 8:0)"},
		{"blkio device limit", func(s *specs.Spec) {
			s.Linux.Resources.BlockIO.ThrottleReadBpsDevice = []specs.LinuxThrottleDevice{{Rate: 1}}
		}, errdefs.IsNotImplemented, "linux.resources.blockIO"},
		{"rdma", func(s *specs.Spec) {
			s.Linux.Resources.Rdma = map[string]specs.LinuxRdma{"mlx5_0": {}}
		}, errdefs.IsNotImplemented, "mlx5_0"},
		{"net_cls", func(s *specs.Spec) {
			s.Linux.Resources.Network = &specs.LinuxNetwork{ClassID: ptr(uint32(3))}
		}, errdefs.IsNotImplemented, "net_cls"},
		{"intel rdt", func(s *specs.Spec) { s.Linux.IntelRdt = &specs.LinuxIntelRdt{} }, errdefs.IsNotImplemented, "intelRdt"},
		{"net devices", func(s *specs.Spec) { s.Linux.NetDevices = map[string]specs.LinuxNetDevice{"eth1": {}} }, errdefs.IsNotImplemented, "netDevices: network device eth1"},
		{"no process", func(s *specs.Spec) { s.Process = nil }, errdefs.IsInvalidArgument, "no process"},
		{"no linux", func(s *specs.Spec) { s.Linux = nil }, errdefs.IsInvalidArgument, "no linux"},
		{"windows", func(s *specs.Spec) { s.Windows = &specs.Windows{} }, errdefs.IsNotImplemented, "windows"},
		{"vm", func(s *specs.Spec) { s.VM = &specs.VM{} }, errdefs.IsNotImplemented, "Cocoon provides the VM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := hostSpec()
			tc.edit(s)
			g, err := GuestSpec(s, "c1")
			if err == nil {
				t.Fatalf("accepted: %+v", g)
			}
			if !tc.sentinel(err) {
				t.Errorf("wrong kind of error: %v", err)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error does not name %q: %v", tc.mention, err)
			}
		})
	}
}

func TestGuestSpecNamesEveryProblem(t *testing.T) {
	s := hostSpec()
	s.Linux.Namespaces = dropNS(s.Linux.Namespaces, specs.NetworkNamespace)
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: "srv"})
	_, err := GuestSpec(s, "c1")
	if err == nil || !strings.Contains(err.Error(), "--net=host") || !strings.Contains(err.Error(), "mount /data") {
		t.Fatalf("want both problems named, got %v", err)
	}
	if _, err := GuestSpec(nil, "c1"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("nil spec: %v", err)
	}
}

func TestGuestProcess(t *testing.T) {
	host := &specs.Process{Args: []string{"ls"}, Cwd: "/", ApparmorProfile: "p", SelinuxLabel: "l", Env: []string{"A=1"}}
	p, err := GuestProcess(host)
	if err != nil {
		t.Fatal(err)
	}
	if p.ApparmorProfile != "" || p.SelinuxLabel != "" || p.Args[0] != "ls" || p.Env[0] != "A=1" {
		t.Fatalf("got %+v", p)
	}
	if host.ApparmorProfile != "p" {
		t.Fatal("host process modified")
	}
	for name, bad := range map[string]*specs.Process{"nil": nil, "no args": {Cwd: "/"}} {
		if _, err := GuestProcess(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func dropNS(nss []specs.LinuxNamespace, t specs.LinuxNamespaceType) []specs.LinuxNamespace {
	var out []specs.LinuxNamespace
	for _, ns := range nss {
		if ns.Type != t {
			out = append(out, ns)
		}
	}
	return out
}

func setNSPath(s *specs.Spec, t specs.LinuxNamespaceType, path string) {
	for i := range s.Linux.Namespaces {
		if s.Linux.Namespaces[i].Type == t {
			s.Linux.Namespaces[i].Path = path
		}
	}
}

// A network namespace with a path is the sandbox's: GuestSpec leaves it
// out (the container shares the VM's namespace, where its interfaces
// are), and NetworkNamespace names it.
func TestGuestSpecJoinedNetwork(t *testing.T) {
	s := hostSpec()
	setNSPath(s, specs.NetworkNamespace, "/var/run/netns/cni-1")
	if got := NetworkNamespace(s); got != "/var/run/netns/cni-1" {
		t.Errorf("NetworkNamespace = %q", got)
	}
	g, err := GuestSpec(s, "c1")
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range g.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			t.Errorf("the guest spec keeps the network namespace %+v", ns)
		}
	}
	if NetworkNamespace(hostSpec()) != "" {
		t.Error("a new network namespace has a path")
	}
	// The host's spec is left as it was.
	if NetworkNamespace(s) != "/var/run/netns/cni-1" {
		t.Error("GuestSpec changed the host spec's namespaces")
	}
}

// Docker 28 and moby v2 give every container a new time namespace; the
// guest's clocks are the VM's own, so it is dropped. Offsets are refused.
func TestGuestSpecTimeNamespace(t *testing.T) {
	host := hostSpec()
	host.Linux.Namespaces = append(host.Linux.Namespaces, specs.LinuxNamespace{Type: specs.TimeNamespace})
	if !HasTimeNamespace(host) {
		t.Fatal("HasTimeNamespace = false")
	}
	g, err := GuestSpec(host, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if HasTimeNamespace(g) {
		t.Errorf("guest namespaces %v: the time namespace is kept", g.Linux.Namespaces)
	}
	if !HasTimeNamespace(host) {
		t.Error("the host's spec lost its time namespace")
	}
	host.Linux.TimeOffsets = map[string]specs.LinuxTimeOffset{"monotonic": {Secs: 3600}}
	if _, err := GuestSpec(host, "c1"); !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "timeOffsets") {
		t.Errorf("offsets: err = %v", err)
	}
}
