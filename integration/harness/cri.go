// containerd's CRI for the integration tests. WithCRI starts an instance
// with its CRI plugin enabled (StartContainerd's default leaves it off),
// configured so that it touches nothing of the host's own CRI:
//
//   - runtime handlers "runc" (io.containerd.runc.v2, the default) and
//     "cocoon" (io.containerd.cocoon.v2, which gets the pod's and the
//     container's io.cocoon.* annotations);
//   - a CNI configuration directory of its own (Dir/cri/net.d) holding
//     one bridge network (bridge, host-local, portmap) on a subnet, bridge
//     and name that no other instance holds at the same time (see
//     reserveSlot), with host-local's addresses under Dir too; the plugins
//     are Debian's (/usr/lib/cni);
//   - network namespaces under its state directory, not /run/netns;
//   - a registry configuration directory of its own (Dir/cri/certs.d),
//     empty unless CRIConfig.RegistryMirror is set;
//   - a stream server (exec, attach, port-forward) on 127.0.0.1 and a
//     free port;
//   - the sandbox image PauseImage, a static pause built from this tree
//     and imported into CRINamespace when containerd is up, so that no
//     pod start pulls anything.
//
// restrict_oom_score_adj is on: the tests run as a root without
// CAP_SYS_RESOURCE, which may not lower an OOM score, and runc fails a
// container that asks for one with "can't get final child's PID from
// pipe: EOF".

package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
)

// CRIConfig is what WithCRI sets up besides the defaults above.
type CRIConfig struct {
	// RegistryMirror is host:port of a plain-HTTP registry on 127.0.0.1
	// that docker.io, registry.k8s.io, k8s.gcr.io, gcr.io and quay.io are
	// mirrored to (hosts.toml files under the instance's
	// registry.config_path), a repository keeping its path there;
	// containerd passes the registry it stands for as the ns query
	// parameter. "" mirrors nothing.
	RegistryMirror string
}

// WithCRI enables containerd's CRI plugin, set up as the file comment
// says. Without it CRI is disabled.
func WithCRI(cfg CRIConfig) Option {
	return func(c *Containerd) { c.cri = &criSetup{cfg: cfg} }
}

// CRINamespace is the containerd namespace of CRI's images, pods and
// containers.
const CRINamespace = "k8s.io"

// CocoonRuntimeHandler and RuncRuntimeHandler are the runtime handlers
// (RuntimeClass handlers) of a CRI instance: Cocoon's and runc's, the
// default.
const (
	CocoonRuntimeHandler = "cocoon"
	RuncRuntimeHandler   = "runc"
)

// criMirrored are the registries CRIConfig.RegistryMirror stands in for.
// k8s.gcr.io, registry.k8s.io's former name, for critest, which pulls
// the same image under both.
var criMirrored = []string{"docker.io", "registry.k8s.io", "k8s.gcr.io", "gcr.io", "quay.io"}

// criPlugins are containerd's plugins that make up CRI, which a CRI
// instance does not disable; the others of a build's disabled list
// (NRI) stay disabled.
var criPlugins = map[string]bool{
	"io.containerd.grpc.v1.cri":                         true,
	"io.containerd.cri.v1.runtime":                      true,
	"io.containerd.cri.v1.images":                       true,
	"io.containerd.podsandbox.controller.v1.podsandbox": true,
	"io.containerd.sandbox.controller.v1.shim":          true,
}

// criSetup is the CRI state of one instance.
type criSetup struct {
	// cfg is what WithCRI was given.
	cfg CRIConfig
	// slot is the instance's slot (see reserveSlot), reservation what
	// holds it.
	slot        int
	reservation net.Listener
	// streamPort is the stream server's port on 127.0.0.1.
	streamPort int
	// netnsBefore are the entries of /run/netns when the instance
	// started, which CRILeftovers does not count.
	netnsBefore map[string]bool
}

// criSlots is how many instances may run CRI at once on a host: slot n
// has the subnet 10.240.n.0/24.
const criSlots = 256

// CRINetwork is the name of the instance's CNI network, and of the host
// entries CNI keeps for it (/var/lib/cni/results/<name>-*).
func (c *Containerd) CRINetwork() string { return fmt.Sprintf("cocoon-cri-%d", c.cri.slot) }

// CRIBridge is the bridge on the host that the instance's pods are
// attached to.
func (c *Containerd) CRIBridge() string { return fmt.Sprintf("cocoon-cri%d", c.cri.slot) }

// CRISubnet is the subnet the instance's pods get their addresses from.
func (c *Containerd) CRISubnet() *net.IPNet {
	return &net.IPNet{IP: net.IPv4(10, 240, byte(c.cri.slot), 0).To4(), Mask: net.CIDRMask(24, 32)}
}

// CRICgroupParent is the cgroup parent that the pod configurations of
// Crictl.PodConfig name: a directory per cgroup v1 hierarchy (cgroupfs
// driver) that Stop removes.
func (c *Containerd) CRICgroupParent() string { return "/" + c.CRINetwork() }

// CRIEndpoint is the CRI endpoint of the instance, as crictl and
// critest take it: its gRPC socket.
func (c *Containerd) CRIEndpoint() string { return "unix://" + c.Address }

// criDir holds the instance's CRI files: CNI configuration and
// addresses, registry hosts, the pause image.
func (c *Containerd) criDir() string { return filepath.Join(c.Dir, "cri") }

// reserveSlot picks a slot that no other instance on the host holds
// (see reserveNetSlot): its subnet is 10.240.<slot>.0/24, its bridge
// CRIBridge's name.
func (s *criSetup) reserveSlot() error {
	slot, l, err := reserveNetSlot(criSlots, "cocoon-cri-slot-",
		func(slot int) string { return fmt.Sprintf("cocoon-cri%d", slot) },
		func(slot int) []*net.IPNet {
			return []*net.IPNet{{IP: net.IPv4(10, 240, byte(slot), 0).To4(), Mask: net.CIDRMask(24, 32)}}
		})
	if err != nil {
		return fmt.Errorf("no free CRI network among 10.240.0.0/16: %w", err)
	}
	s.slot, s.reservation = slot, l
	return nil
}

// prepareCRI reserves the instance's slot and stream port and writes its
// CNI and registry configuration, then returns containerd's
// configuration with CRI enabled.
func (c *Containerd) prepareCRI(version int, disabled []string) (string, error) {
	s := c.cri
	if err := s.reserveSlot(); err != nil {
		return "", err
	}
	port, err := freePort()
	if err != nil {
		return "", err
	}
	s.streamPort = port
	s.netnsBefore = map[string]bool{}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		s.netnsBefore[e.Name()] = true
	}
	if err := c.writeCNIConfig(); err != nil {
		return "", err
	}
	if err := c.writeRegistryHosts(); err != nil {
		return "", err
	}
	var keep []string
	for _, p := range disabled {
		if !criPlugins[p] {
			keep = append(keep, p)
		}
	}
	cfg := c.config(version, keep)
	if version >= 3 {
		return cfg + c.criConfigV3(), nil
	}
	return cfg + c.criConfigV2(), nil
}

// freePort is a TCP port on 127.0.0.1 that nothing listened on a moment
// ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// criConfigV2 is the CRI part of a version 2 configuration (containerd
// 1.6 and 1.7): one plugin, io.containerd.grpc.v1.cri, for everything.
func (c *Containerd) criConfigV2() string {
	const p = `plugins."io.containerd.grpc.v1.cri"`
	var b strings.Builder
	fmt.Fprintf(&b, "[%s]\n", p)
	fmt.Fprintf(&b, "  sandbox_image = %q\n", PauseImage)
	fmt.Fprintf(&b, "  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"%d\"\n", c.cri.streamPort)
	b.WriteString(criRuntimeSettings)
	fmt.Fprintf(&b, "[%s.containerd]\n", p)
	b.WriteString(criRuntimes(p + ".containerd"))
	fmt.Fprintf(&b, "[%s.cni]\n  bin_dir = %q\n  conf_dir = %q\n  max_conf_num = 1\n", p, CNIPath, filepath.Join(c.criDir(), "net.d"))
	fmt.Fprintf(&b, "[%s.registry]\n  config_path = %q\n", p, filepath.Join(c.criDir(), "certs.d"))
	return b.String()
}

// criConfigV3 is the CRI part of a version 3 configuration (containerd
// 2.x): runtimes and CNI in io.containerd.cri.v1.runtime, the sandbox
// image and registries in io.containerd.cri.v1.images, the stream server
// in io.containerd.grpc.v1.cri. Pods are the podsandbox controller's.
func (c *Containerd) criConfigV3() string {
	const rt, img, srv = `plugins."io.containerd.cri.v1.runtime"`, `plugins."io.containerd.cri.v1.images"`, `plugins."io.containerd.grpc.v1.cri"`
	var b strings.Builder
	fmt.Fprintf(&b, "[%s]\n", rt)
	b.WriteString(criRuntimeSettings)
	fmt.Fprintf(&b, "[%s.containerd]\n", rt)
	b.WriteString(criRuntimes(rt + ".containerd"))
	fmt.Fprintf(&b, "[%s.cni]\n  bin_dirs = [%q]\n  conf_dir = %q\n  max_conf_num = 1\n", rt, CNIPath, filepath.Join(c.criDir(), "net.d"))
	fmt.Fprintf(&b, "[%s]\n", img)
	fmt.Fprintf(&b, "[%s.pinned_images]\n  sandbox = %q\n", img, PauseImage)
	fmt.Fprintf(&b, "[%s.registry]\n  config_path = %q\n", img, filepath.Join(c.criDir(), "certs.d"))
	fmt.Fprintf(&b, "[%s]\n", srv)
	fmt.Fprintf(&b, "  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"%d\"\n", c.cri.streamPort)
	return b.String()
}

// criRuntimeSettings are the runtime settings both schemas share, in the
// table of their runtime settings (see the file comment).
const criRuntimeSettings = "  restrict_oom_score_adj = true\n  netns_mounts_under_state_dir = true\n"

// criRuntimes is the runtime handlers' part of the table named containerd
// (the "containerd" table of the runtime settings).
func criRuntimes(containerd string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  default_runtime_name = %q\n", RuncRuntimeHandler)
	fmt.Fprintf(&b, "[%s.runtimes.%s]\n  runtime_type = \"io.containerd.runc.v2\"\n", containerd, RuncRuntimeHandler)
	fmt.Fprintf(&b, "[%s.runtimes.%s]\n  runtime_type = %q\n", containerd, CocoonRuntimeHandler, CocoonRuntime)
	b.WriteString("  pod_annotations = [\"io.cocoon.*\"]\n  container_annotations = [\"io.cocoon.*\"]\n")
	b.WriteString("  privileged_without_host_devices = true\n")
	return b.String()
}

// writeCNIConfig writes the instance's one CNI network: a bridge with the
// gateway's address, host-local addresses of the instance's subnet kept
// under Dir, and portmap for the pods' port mappings (CRI adds loopback
// itself). No masquerading: pods talk to each other and to the host,
// and leave no NAT rule behind.
func (c *Containerd) writeCNIConfig() error {
	dir := filepath.Join(c.criDir(), "net.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       c.CRINetwork(),
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      c.CRIBridge(),
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": c.CRISubnet().String()}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": filepath.Join(c.criDir(), "ipam"),
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "10-"+c.CRINetwork()+".conflist"), data, 0o644)
}

// writeRegistryHosts makes the instance's registry.config_path directory
// and, when a mirror is set, a hosts.toml per mirrored registry that
// sends pulls to the mirror, with the mirror as the server too so that
// a pull the mirror fails never reaches the registry itself.
func (c *Containerd) writeRegistryHosts() error {
	dir := filepath.Join(c.criDir(), "certs.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	m := c.cri.cfg.RegistryMirror
	if m == "" {
		return nil
	}
	hosts := fmt.Sprintf("server = \"http://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", m, m)
	for _, r := range criMirrored {
		if err := os.MkdirAll(filepath.Join(dir, r), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, r, "hosts.toml"), []byte(hosts), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// stopCRI removes what the instance's CRI leaves on the host once
// containerd and its shims are gone: its bridge, its cgroup parent's
// directories, CNI's cached results of its network; then it releases its
// slot.
func (c *Containerd) stopCRI() error {
	s := c.cri
	if s.reservation == nil {
		return nil
	}
	var errs []error
	if l, err := netlink.LinkByName(c.CRIBridge()); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("remove the bridge %s: %w", c.CRIBridge(), err))
		}
	}
	for _, d := range c.criCgroupDirs() {
		// Children first: runc removes a container's own directory only.
		kids, _ := filepath.Glob(filepath.Join(d, "*", "cgroup.procs"))
		for _, k := range kids {
			_ = syscall.Rmdir(filepath.Dir(k))
		}
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("remove the cgroup %s: %w", d, err))
		}
	}
	results, _ := filepath.Glob(filepath.Join(cniStateDir, "results", c.CRINetwork()+"-*"))
	for _, r := range results {
		errs = append(errs, os.Remove(r))
	}
	errs = append(errs, s.reservation.Close())
	s.reservation = nil
	return errors.Join(errs...)
}

// cgroupRoot is where the cgroup hierarchies are mounted: cgroup v2's
// one, or a directory per cgroup v1 hierarchy.
const cgroupRoot = "/sys/fs/cgroup"

// criCgroupDirs are the directories of the instance's cgroup parent
// (CRICgroupParent) that exist: in each cgroup v1 hierarchy, or cgroup
// v2's.
func (c *Containerd) criCgroupDirs() []string {
	dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", c.CRICgroupParent()))
	if _, err := os.Stat(filepath.Join(cgroupRoot, c.CRICgroupParent(), "cgroup.procs")); err == nil {
		dirs = append(dirs, filepath.Join(cgroupRoot, c.CRICgroupParent()))
	}
	return dirs
}
