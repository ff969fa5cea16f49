package oci

import (
	"fmt"
	"path"
	"regexp"
	"strconv"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/guest/api"
)

// CRI's annotations, the same in containerd 1.6 to 2.x. A pod's sandbox
// (pause) container has type "sandbox" and its own id as sandbox id; the
// pod's other containers have type "container" and the pod's sandbox id.
const (
	AnnotationCRIContainerType = criContainerType
	AnnotationCRISandboxID     = "io.kubernetes.cri.sandbox-id"
	CRIContainerTypeSandbox    = "sandbox"
	CRIContainerTypeContainer  = "container"
	// The pod's limits, the sums of its containers', which kubelet
	// (1.23 and later) gives with the pod and CRI sets on the sandbox
	// container: CPU period and quota in microseconds, memory in bytes.
	AnnotationCRISandboxCPUPeriod = "io.kubernetes.cri.sandbox-cpu-period"
	AnnotationCRISandboxCPUQuota  = "io.kubernetes.cri.sandbox-cpu-quota"
	AnnotationCRISandboxMemory    = "io.kubernetes.cri.sandbox-memory"
)

// IsPodSandbox reports whether spec is a pod's sandbox (pause) container.
func IsPodSandbox(spec *specs.Spec) bool {
	return spec != nil && spec.Annotations[criContainerType] == CRIContainerTypeSandbox
}

// isPodContainer reports whether spec is a container of a pod other than
// its sandbox: one that joins the pod's namespaces.
func isPodContainer(spec *specs.Spec) bool {
	return spec != nil && spec.Annotations[criContainerType] == CRIContainerTypeContainer
}

// podNamespaceFiles are the namespaces a pod's container may join in
// the pod's sandbox container, with their file in /proc/<pid>/ns: IPC
// and UTS always (CRI), PID when the pod shares its process namespace
// (or targets another container's: every container's task pid is the
// VM's, so it is the pod's too).
var podNamespaceFiles = map[specs.LinuxNamespaceType]string{
	specs.IPCNamespace: "ipc",
	specs.UTSNamespace: "uts",
	specs.PIDNamespace: "pid",
}

// procNamespace matches CRI's path of a sandbox's namespace,
// /proc/<task pid>/ns/<file>.
var procNamespace = regexp.MustCompile(`^/proc/([1-9][0-9]{0,9})/ns/([a-z]+)$`)

// podNamespacePID returns the host pid whose namespace ns joins, if ns
// is one a pod's container may join in its sandbox.
func podNamespacePID(ns specs.LinuxNamespace) (uint32, bool) {
	file, ok := podNamespaceFiles[ns.Type]
	if !ok {
		return 0, false
	}
	m := procNamespace.FindStringSubmatch(ns.Path)
	if m == nil || m[2] != file {
		return 0, false
	}
	pid, err := strconv.ParseUint(m[1], 10, 32)
	return uint32(pid), err == nil
}

// JoinPod points the namespaces that g, the guest spec of a pod's
// container, joins in its pod's sandbox container at that container's
// in the guest: CRI names them /proc/<the sandbox task's pid>/ns/<type>,
// and the sandbox task's pid is the VM's (hostPID). podPID is the guest
// pid of the sandbox container's init; 0 when the VM has none. A spec
// that is not a pod's container is left as it is.
func JoinPod(g *specs.Spec, hostPID, podPID uint32) error {
	if !isPodContainer(g) || g.Linux == nil {
		return nil
	}
	for i, ns := range g.Linux.Namespaces {
		if ns.Path == "" || ns.Type == specs.NetworkNamespace {
			continue
		}
		pid, ok := podNamespacePID(ns)
		if !ok {
			return fmt.Errorf("linux.namespaces: the %s namespace joins %s, which is not a namespace of the pod: %w", ns.Type, ns.Path, errdefs.ErrNotImplemented)
		}
		if hostPID != 0 && pid != hostPID {
			return fmt.Errorf("linux.namespaces: the %s namespace joins that of host process %d, which is not this pod's VM (pid %d): %w", ns.Type, pid, hostPID, errdefs.ErrFailedPrecondition)
		}
		if podPID == 0 {
			return fmt.Errorf("linux.namespaces: the %s namespace joins the pod's sandbox container, which is not in this VM: %w", ns.Type, errdefs.ErrFailedPrecondition)
		}
		g.Linux.Namespaces[i].Path = path.Join("/proc", strconv.FormatUint(uint64(podPID), 10), "ns", podNamespaceFiles[ns.Type])
	}
	return nil
}

// ShmDestination is where a container has its POSIX shared memory.
const ShmDestination = "/dev/shm"

// isShmBind reports whether m is a bind mount of the container's
// /dev/shm (CRI's sandbox shm, Docker's): the guest serves it from
// api.ShmDir, the sandbox's own tmpfs, not from the host's.
func isShmBind(m specs.Mount) bool {
	return isBind(m) && path.Clean(m.Destination) == ShmDestination
}

// translateShm points each bind of /dev/shm in g at the guest's shm.
func translateShm(g *specs.Spec) {
	for i, m := range g.Mounts {
		if isShmBind(m) {
			g.Mounts[i].Source = api.ShmDir
			g.Mounts[i].Type = "bind"
		}
	}
}

// PodResources are the limits of a pod as a whole, which size its VM:
// what CRI's sandbox annotations say (the sums of the containers'
// limits, when kubelet gives them), or else the sandbox container's own.
// nil for a spec that is not a pod's sandbox. A malformed annotation is
// an error naming it.
func PodResources(spec *specs.Spec) (*specs.LinuxResources, error) {
	if !IsPodSandbox(spec) {
		return nil, nil
	}
	a := spec.Annotations
	num := func(key string) (int64, error) {
		v, ok := a[key]
		if !ok || v == "" {
			return 0, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("annotation %s=%q: %w: want a whole number, 0 or more", key, v, errdefs.ErrInvalidArgument)
		}
		return n, nil
	}
	mem, err := num(AnnotationCRISandboxMemory)
	if err != nil {
		return nil, err
	}
	quota, err := num(AnnotationCRISandboxCPUQuota)
	if err != nil {
		return nil, err
	}
	period, err := num(AnnotationCRISandboxCPUPeriod)
	if err != nil {
		return nil, err
	}
	var r specs.LinuxResources
	if mem > 0 {
		r.Memory = &specs.LinuxMemory{Limit: &mem}
	}
	if quota > 0 {
		p := uint64(period)
		r.CPU = &specs.LinuxCPU{Quota: &quota}
		if p > 0 {
			r.CPU.Period = &p
		}
	}
	if r.Memory == nil && r.CPU == nil {
		if spec.Linux != nil {
			return spec.Linux.Resources, nil
		}
		return nil, nil
	}
	return &r, nil
}

// PodCgroupsPath is the host cgroup of a pod's sandbox container, in the
// pod's cgroup: what runc would put the pause process in, and what
// Cocoon puts the pod's VM in. "" for another spec, or one without.
func PodCgroupsPath(spec *specs.Spec) string {
	if !IsPodSandbox(spec) || spec.Linux == nil {
		return ""
	}
	return spec.Linux.CgroupsPath
}
