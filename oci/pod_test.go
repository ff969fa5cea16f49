package oci

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/guest/api"
)

// podContainerSpec is what containerd's CRI writes for a pod's app
// container whose sandbox task has pid 4242: the pod's network, IPC and
// UTS namespaces (and PID, with shareProcessNamespace), and binds of
// the pod's hosts, hostname, resolv.conf and shm.
func podContainerSpec() *specs.Spec {
	s := hostSpec()
	s.Annotations = map[string]string{AnnotationCRIContainerType: CRIContainerTypeContainer, AnnotationCRISandboxID: "pod1"}
	s.Linux.Namespaces = []specs.LinuxNamespace{
		{Type: specs.PIDNamespace, Path: "/proc/4242/ns/pid"},
		{Type: specs.IPCNamespace, Path: "/proc/4242/ns/ipc"},
		{Type: specs.UTSNamespace, Path: "/proc/4242/ns/uts"},
		{Type: specs.MountNamespace},
		{Type: specs.NetworkNamespace, Path: "/proc/4242/ns/net"},
	}
	sb := "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/pod1"
	s.Mounts = append(s.Mounts[:3], // drop the tmpfs /dev/shm of ctr's default
		specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: sb + "/hosts", Options: []string{"rbind", "rprivate", "rw"}},
		specs.Mount{Destination: "/etc/hostname", Type: "bind", Source: sb + "/hostname", Options: []string{"rbind", "rprivate", "rw"}},
		specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: sb + "/resolv.conf", Options: []string{"rbind", "rprivate", "rw"}},
		specs.Mount{Destination: "/dev/shm", Type: "bind", Source: "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/pod1/shm", Options: []string{"rbind", "rprivate", "rw"}},
	)
	return s
}

func TestPodContainerJoinsThePodInTheGuest(t *testing.T) {
	host := podContainerSpec()
	g, err := GuestSpec(host, "app")
	if err != nil {
		t.Fatal(err)
	}
	if err := JoinPod(g, 4242, 7); err != nil {
		t.Fatal(err)
	}
	want := map[specs.LinuxNamespaceType]string{
		specs.PIDNamespace: "/proc/7/ns/pid", specs.IPCNamespace: "/proc/7/ns/ipc", specs.UTSNamespace: "/proc/7/ns/uts", specs.MountNamespace: "",
	}
	if len(g.Linux.Namespaces) != len(want) {
		t.Fatalf("namespaces %+v, want %v (no network namespace: the VM's own mirrors the pod's)", g.Linux.Namespaces, want)
	}
	for _, ns := range g.Linux.Namespaces {
		if p, ok := want[ns.Type]; !ok || p != ns.Path {
			t.Errorf("namespace %s: path %q, want %q", ns.Type, ns.Path, want[ns.Type])
		}
	}
	// The files reach the guest through the share, /dev/shm is the
	// guest's, and only the files are binds the host makes.
	for _, m := range g.Mounts {
		switch m.Destination {
		case "/etc/hosts", "/etc/hostname", "/etc/resolv.conf":
			if !strings.HasPrefix(m.Source, api.ShareRoot+"/app/") {
				t.Errorf("%s from %s, want the share", m.Destination, m.Source)
			}
		case "/dev/shm":
			if m.Source != api.ShmDir || m.Type != "bind" {
				t.Errorf("/dev/shm: %+v, want a bind of %s", m, api.ShmDir)
			}
		}
	}
	binds := Binds(host)
	if len(binds) != 3 {
		t.Fatalf("binds %+v: want the three files, not /dev/shm", binds)
	}
	if host.Linux.Namespaces[0].Path != "/proc/4242/ns/pid" {
		t.Error("the host spec was changed")
	}
}

func TestJoinPodRefuses(t *testing.T) {
	g, err := GuestSpec(podContainerSpec(), "app")
	if err != nil {
		t.Fatal(err)
	}
	if err := JoinPod(g, 99, 7); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "host process 4242") {
		t.Errorf("another VM's namespaces: %v", err)
	}
	if err := JoinPod(g, 4242, 0); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "not in this VM") {
		t.Errorf("no sandbox container: %v", err)
	}

	// Outside a pod, or a namespace of the host's: refused by GuestSpec.
	for name, change := range map[string]func(*specs.Spec){
		"not in a pod":        func(s *specs.Spec) { s.Annotations = nil },
		"mount namespace":     func(s *specs.Spec) { s.Linux.Namespaces[3].Path = "/proc/4242/ns/mnt" },
		"a named namespace":   func(s *specs.Spec) { s.Linux.Namespaces[1].Path = "/var/run/ipcns/x" },
		"another type's file": func(s *specs.Spec) { s.Linux.Namespaces[1].Path = "/proc/4242/ns/uts" },
		"pid 0":               func(s *specs.Spec) { s.Linux.Namespaces[1].Path = "/proc/0/ns/ipc" },
	} {
		s := podContainerSpec()
		change(s)
		if _, err := GuestSpec(s, "app"); !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "outside the VM") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestPodSandboxShm(t *testing.T) {
	s := hostSpec()
	s.Annotations = map[string]string{AnnotationCRIContainerType: CRIContainerTypeSandbox}
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/dev/shm/", Type: "bind", Source: "/run/containerd/sandboxes/x/shm", Options: []string{"rbind", "ro"}})
	g, err := GuestSpec(s, "x")
	if err != nil {
		t.Fatal(err)
	}
	last := g.Mounts[len(g.Mounts)-1]
	if last.Source != api.ShmDir || strings.Join(last.Options, ",") != "rbind,ro" {
		t.Errorf("shm mount %+v", last)
	}
	if !IsPodSandbox(s) || IsPodSandbox(hostSpec()) {
		t.Error("IsPodSandbox")
	}
}

func TestPodResources(t *testing.T) {
	s := hostSpec()
	if r, err := PodResources(s); r != nil || err != nil {
		t.Fatalf("not a pod: %v %v", r, err)
	}
	s.Annotations = map[string]string{
		AnnotationCRIContainerType:    CRIContainerTypeSandbox,
		AnnotationCRISandboxMemory:    "1073741824",
		AnnotationCRISandboxCPUQuota:  "250000",
		AnnotationCRISandboxCPUPeriod: "100000",
	}
	r, err := PodResources(s)
	if err != nil {
		t.Fatal(err)
	}
	if *r.Memory.Limit != 1<<30 || *r.CPU.Quota != 250000 || *r.CPU.Period != 100000 {
		t.Fatalf("resources %+v %+v", r.Memory, r.CPU)
	}
	// kubelet gives 0 for a pod without limits: the sandbox's own stay.
	s.Annotations[AnnotationCRISandboxMemory], s.Annotations[AnnotationCRISandboxCPUQuota] = "0", "0"
	if r, err := PodResources(s); err != nil || r != s.Linux.Resources {
		t.Fatalf("no pod limits: %v %v", r, err)
	}
	s.Annotations[AnnotationCRISandboxMemory] = "lots"
	if _, err := PodResources(s); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), AnnotationCRISandboxMemory) {
		t.Fatalf("malformed: %v", err)
	}
}

func TestPrivilegedHostDevicesNamed(t *testing.T) {
	s := hostSpec()
	for i := range 40 {
		s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: "/dev/sd" + string(rune('a'+i%26)), Type: "b", Major: 8, Minor: int64(i)})
	}
	_, err := GuestSpec(s, "x")
	if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "40 host devices") || !strings.Contains(err.Error(), "privileged_without_host_devices") {
		t.Fatalf("err = %v", err)
	}
	if n := strings.Count(err.Error(), "linux.devices"); n != 1 {
		t.Errorf("%d device errors, want one for all", n)
	}
}
