package oci

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// GuestCgroupParent is where the agent puts a container's cgroup in the
// guest (<GuestCgroupParent>/<container id>) when the spec names none.
const GuestCgroupParent = "/cocoon"

// kernelFilesystems are the mount types that need nothing from the host:
// the guest kernel provides them.
var kernelFilesystems = []string{"proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "ramfs"}

// standardDevice is a device node runc creates in every container anyway;
// listing it in linux.devices is harmless.
type standardDevice struct {
	major, minor int64
}

var standardDevices = map[string]standardDevice{
	"/dev/null":    {1, 3},
	"/dev/zero":    {1, 5},
	"/dev/full":    {1, 7},
	"/dev/random":  {1, 8},
	"/dev/urandom": {1, 9},
	"/dev/tty":     {5, 0},
	"/dev/console": {5, 1},
	"/dev/ptmx":    {5, 2},
}

// GuestSpec translates the OCI spec containerd wrote for a container (the
// host's view, config.json in the bundle) into the spec runc runs in the
// guest. The host spec is not modified.
//
// What changes:
//   - root.path is cleared: the agent sets it to the root it assembles
//     from the container's disks. root.readonly is kept.
//   - linux.cgroupsPath is cleared: host cgroup paths (and systemd's
//     slice:prefix:name form) mean nothing in the guest, which has no
//     systemd; the agent uses GuestCgroupParent/<container id>.
//   - The AppArmor profile and SELinux labels are dropped: the guest
//     kernel has neither LSM, and the VM is the isolation boundary.
//   - A new time namespace is dropped (withoutTimeNamespace): the
//     guest's clocks are the VM's own. Clock offsets are refused.
//
// What is refused, each problem named in the error (all of them at once):
//   - joining an existing namespace (a namespace with a path) other
//     than the network namespace the VM mirrors and, for a pod's
//     container, its pod's IPC, UTS and PID namespaces (JoinPod
//     translates those), and
//     running without a network, pid or ipc namespace (--net=host,
//     --pid=host, --ipc=host): the host's namespaces are outside the VM.
//     errdefs.ErrNotImplemented.
//   - A bind mount of /dev/shm points at the sandbox's shm in the
//     guest (api.ShmDir), a tmpfs of the guest's.
//   - Other bind mounts of host paths point at the sandbox's share in the
//     guest (BindGuestPath): the host binds each source there and the
//     share reaches the guest through virtio-fs. A relative source is
//     refused (ErrInvalidArgument).
//   - The hooks that run in the runtime's namespace (prestart,
//     createRuntime, createContainer, poststart, poststop) are dropped:
//     their binaries are on the host, and the shim runs them there.
//     startContainer hooks run inside the container and are kept.
//   - devices other than the standard ones runc creates itself: the VM
//     has only its own devices. ErrNotImplemented.
//   - mounts of anything but kernel filesystems and bind mounts.
//     ErrNotImplemented.
//   - per-device block I/O limits, RDMA limits, net_cls/net_prio, Intel
//     RDT and network devices to move into the container: they name host
//     devices or host-only controllers. ErrNotImplemented.
//   - a spec without process or linux section, or for another platform
//     (windows, solaris, vm). ErrInvalidArgument or ErrNotImplemented.
//
// containerID names the container's binds in the share.
func GuestSpec(host *specs.Spec, containerID string) (*specs.Spec, error) {
	if host == nil {
		return nil, fmt.Errorf("no spec: %w", errdefs.ErrInvalidArgument)
	}
	var g specs.Spec
	if err := deepCopy(host, &g); err != nil {
		return nil, err
	}
	var errs []error
	fail := func(sentinel error, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), sentinel))
	}

	if g.Process == nil {
		fail(errdefs.ErrInvalidArgument, "spec has no process to run")
	} else {
		clearLabels(g.Process)
	}
	if g.Windows != nil {
		fail(errdefs.ErrNotImplemented, "windows: Cocoon runs Linux containers")
	}
	if g.Solaris != nil {
		fail(errdefs.ErrNotImplemented, "solaris: Cocoon runs Linux containers")
	}
	if g.VM != nil {
		fail(errdefs.ErrNotImplemented, "vm: the spec asks for its own VM (kernel and image); Cocoon provides the VM")
	}
	readonly := g.Root != nil && g.Root.Readonly
	g.Root = &specs.Root{Readonly: readonly}

	if g.Linux == nil {
		fail(errdefs.ErrInvalidArgument, "spec has no linux section")
	} else {
		g.Linux.CgroupsPath = ""
		g.Linux.MountLabel = ""
		checkNamespaces(g.Linux.Namespaces, isPodContainer(&g), fail)
		g.Linux.Namespaces = withoutMirroredNetwork(&g)
		g.Linux.Namespaces = withoutTimeNamespace(g.Linux, fail)
		checkDevices(g.Linux.Devices, fail)
		checkResources(g.Linux.Resources, fail)
		if g.Linux.IntelRdt != nil {
			fail(errdefs.ErrNotImplemented, "linux.intelRdt: Intel RDT is a host resource the VM does not have")
		}
		for name := range g.Linux.NetDevices {
			fail(errdefs.ErrNotImplemented, "linux.netDevices: network device %s is a host device; it cannot move into the VM", name)
		}
	}
	checkMounts(g.Mounts, fail)
	translateShm(&g)
	translateBinds(&g, containerID, fail)
	dropHostHooks(&g)
	if len(errs) > 0 {
		return nil, fmt.Errorf("the container cannot run in a Cocoon VM: %w", errors.Join(errs...))
	}
	return &g, nil
}

// GuestProcess translates an exec's OCI process for the guest: its
// AppArmor profile and SELinux label are dropped, as GuestSpec does for
// the container's init. The host process is not modified.
func GuestProcess(host *specs.Process) (*specs.Process, error) {
	if host == nil {
		return nil, fmt.Errorf("no process: %w", errdefs.ErrInvalidArgument)
	}
	if len(host.Args) == 0 && host.CommandLine == "" {
		return nil, fmt.Errorf("process has no program to run: %w", errdefs.ErrInvalidArgument)
	}
	var p specs.Process
	if err := deepCopy(host, &p); err != nil {
		return nil, err
	}
	clearLabels(&p)
	return &p, nil
}

func clearLabels(p *specs.Process) {
	p.ApparmorProfile = ""
	p.SelinuxLabel = ""
}

func deepCopy(from, to any) error {
	b, err := json.Marshal(from)
	if err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
	}
	if err := json.Unmarshal(b, to); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
	}
	return nil
}

type failFunc func(sentinel error, format string, args ...any)

// hostNamespaceFlags are the options that leave a namespace out.
var hostNamespaceFlags = map[specs.LinuxNamespaceType]string{
	specs.NetworkNamespace: "--net=host, hostNetwork",
	specs.PIDNamespace:     "--pid=host, hostPID",
	specs.IPCNamespace:     "--ipc=host, hostIPC",
}

func checkNamespaces(nss []specs.LinuxNamespace, inPod bool, fail failFunc) {
	have := map[specs.LinuxNamespaceType]bool{}
	for _, ns := range nss {
		have[ns.Type] = true
		// A network namespace with a path is the sandbox's: its
		// interfaces are mirrored into the VM (NetworkNamespace), whose
		// own namespace the container shares. A pod's container joins
		// the pod's IPC, UTS and PID namespaces, which are its sandbox
		// container's in the guest (JoinPod).
		if _, ok := podNamespacePID(ns); ok && inPod {
			continue
		}
		if ns.Path != "" && ns.Type != specs.NetworkNamespace {
			fail(errdefs.ErrNotImplemented, "linux.namespaces: the %s namespace joins %s, a namespace outside the VM", ns.Type, ns.Path)
		}
	}
	for _, t := range []specs.LinuxNamespaceType{specs.NetworkNamespace, specs.PIDNamespace, specs.IPCNamespace} {
		if !have[t] {
			fail(errdefs.ErrNotImplemented, "linux.namespaces: no %s namespace (%s): the host's %s namespace is outside the VM", t, hostNamespaceFlags[t], t)
		}
	}
	if !have[specs.MountNamespace] {
		fail(errdefs.ErrInvalidArgument, "linux.namespaces: no mount namespace; runc needs one")
	}
}

// withoutMirroredNetwork drops the network namespace when the VM mirrors
// the sandbox's host namespace (HostNetwork): in the guest the container
// runs in the VM's network namespace, where that namespace's interfaces
// are. Otherwise a network namespace stays: the container gets one of its
// own in the guest, with loopback only.
func withoutMirroredNetwork(spec *specs.Spec) []specs.LinuxNamespace {
	if path, create := HostNetwork(spec); path == "" && !create {
		return spec.Linux.Namespaces
	}
	out := make([]specs.LinuxNamespace, 0, len(spec.Linux.Namespaces))
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type != specs.NetworkNamespace {
			out = append(out, ns)
		}
	}
	return out
}

// withoutTimeNamespace drops a new time namespace without offsets, which
// Docker 28 and moby v2 ask for on every container whose host has time
// namespaces: such a namespace shows its processes the clocks of the one
// it is made in, and in the guest those are the VM's own (its boot time,
// its monotonic clock), apart from the host's already; crun 1.8 in the
// guest fails to make one. Offsets, or a time namespace to join, would
// need the namespace: refused. The host's spec is unchanged; HasTimeNamespace
// lets the shim log what it dropped.
func withoutTimeNamespace(l *specs.Linux, fail failFunc) []specs.LinuxNamespace {
	if len(l.TimeOffsets) > 0 {
		fail(errdefs.ErrNotImplemented, "linux.timeOffsets: clock offsets need a time namespace, which the guest does not make")
	}
	out := make([]specs.LinuxNamespace, 0, len(l.Namespaces))
	for _, ns := range l.Namespaces {
		if ns.Type == specs.TimeNamespace {
			continue
		}
		out = append(out, ns)
	}
	return out
}

// HasTimeNamespace reports whether spec asks for a time namespace, which
// GuestSpec drops.
func HasTimeNamespace(spec *specs.Spec) bool {
	return spec != nil && spec.Linux != nil && slices.ContainsFunc(spec.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.TimeNamespace })
}

// NetworkNamespace is the path of the network namespace spec joins, the
// sandbox's, whose interfaces the VM mirrors; "" when it makes a new one
// or has none.
func NetworkNamespace(spec *specs.Spec) string {
	path, _ := HostNetwork(spec)
	return path
}

// HostNetwork says which network namespace on the host the VM of spec's
// sandbox mirrors: the one at path, which the spec joins (CNI's through
// CRI, ctr --with-ns), or with create a new one that the shim makes. The
// shim makes one for a spec that asks for a new network namespace and
// either has hooks on the host, which fill it before the VM boots as they
// fill runc's (nerdctl's createRuntime, which runs CNI; Docker's prestart
// up to 25), or is from a client that fills it after the task's Create
// (LateNetwork: Docker 26 and later). Without either nothing on the host
// would ever add to it, and the container's own namespace in the guest is
// the same: loopback only. Neither: the spec has no network namespace.
func HostNetwork(spec *specs.Spec) (path string, create bool) {
	ns, ok := networkNamespaceOf(spec)
	if !ok {
		return "", false
	}
	return ns.Path, ns.Path == "" && (HasHostHooks(spec.Hooks) || LateNetwork(spec))
}

// networkNamespaceOf is spec's network namespace entry, if it has one.
func networkNamespaceOf(spec *specs.Spec) (specs.LinuxNamespace, bool) {
	if spec == nil || spec.Linux == nil {
		return specs.LinuxNamespace{}, false
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns, true
		}
	}
	return specs.LinuxNamespace{}, false
}

// networkFiles are the files of a container that the client that manages
// its network writes on the host and binds in.
var networkFiles = []string{"/etc/hosts", "/etc/resolv.conf"}

// LateNetwork reports whether spec is from a client that puts the
// container's network interfaces into its new network namespace after the
// task's Create and before its Start, through the task's pid
// (/proc/<pid>/ns/net): Docker 26 and later, moby v2, which run no hook.
// Such a spec asks for a new network namespace, has no hooks on the host,
// and binds the client's own /etc/hosts or /etc/resolv.conf from the
// host: the client manages the container's network. (ctr run binds
// neither; nerdctl's createRuntime hook fills the namespace before the
// boot.) Its VM gets a spare NIC to bind the late interface to at Start
// (docs/networking.md).
func LateNetwork(spec *specs.Spec) bool {
	if ns, ok := networkNamespaceOf(spec); !ok || ns.Path != "" || HasHostHooks(spec.Hooks) {
		return false
	}
	for _, b := range Binds(spec) {
		if slices.Contains(networkFiles, filepath.Clean(b.Destination)) {
			return true
		}
	}
	return false
}

func checkMounts(mounts []specs.Mount, fail failFunc) {
	for _, m := range mounts {
		if !isBind(m) && !slices.Contains(kernelFilesystems, m.Type) {
			fail(errdefs.ErrNotImplemented, "mount %s: filesystem type %q from %s is not available in the VM (only kernel filesystems: %v)", m.Destination, m.Type, m.Source, kernelFilesystems)
		}
	}
}

// manyDevices is the count of host devices past which a spec is taken
// for a privileged container's, which lists every device of the host.
const manyDevices = 8

func checkDevices(devices []specs.LinuxDevice, fail failFunc) {
	var host []specs.LinuxDevice
	for _, d := range devices {
		if std, ok := standardDevices[d.Path]; ok && d.Type == "c" && d.Major == std.major && d.Minor == std.minor {
			continue
		}
		host = append(host, d)
	}
	if len(host) > manyDevices {
		fail(errdefs.ErrNotImplemented, "linux.devices: %d host devices (%s, %s, ...), as a privileged container gets them; the VM has only its own: "+
			"run it without them (containerd's CRI: privileged_without_host_devices = true for the runtime; Docker and nerdctl: no --privileged)",
			len(host), host[0].Path, host[1].Path)
		return
	}
	for _, d := range host {
		fail(errdefs.ErrNotImplemented, "linux.devices: device %s (%s %d:%d) is a host device; the VM has only its own", d.Path, d.Type, d.Major, d.Minor)
	}
}

func checkResources(r *specs.LinuxResources, fail failFunc) {
	if r == nil {
		return
	}
	if b := r.BlockIO; b != nil {
		for _, list := range [][]specs.LinuxThrottleDevice{b.ThrottleReadBpsDevice, b.ThrottleWriteBpsDevice, b.ThrottleReadIOPSDevice, b.ThrottleWriteIOPSDevice} {
			for _, d := range list {
				fail(errdefs.ErrNotImplemented, "linux.resources.blockIO: the limit on block device %d:%d names a host device", d.Major, d.Minor)
			}
		}
		for _, d := range b.WeightDevice {
			fail(errdefs.ErrNotImplemented, "linux.resources.blockIO: the weight of block device %d:%d names a host device", d.Major, d.Minor)
		}
	}
	for dev := range r.Rdma {
		fail(errdefs.ErrNotImplemented, "linux.resources.rdma: RDMA device %s is a host device", dev)
	}
	if r.Network != nil && (r.Network.ClassID != nil || len(r.Network.Priorities) > 0) {
		fail(errdefs.ErrNotImplemented, "linux.resources.network: net_cls and net_prio are cgroup v1 controllers; the guest runs cgroup v2")
	}
}
