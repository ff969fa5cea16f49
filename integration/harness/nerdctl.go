// nerdctl for the integration tests: v1.7.7, built from the Go module
// proxy by `make test-deps` (integration/install-nerdctl.sh) into
// /opt/cocoon-test/nerdctl-1.7; nerdctl 2 does not build from the proxy.
// Its CNI plugins are Debian's containernetworking-plugins (1.1.1), in
// /usr/lib/cni, with the host's iptables (Debian 12's iptables-nft).
//
// Each Nerdctl has a private data root and a private CNI config directory
// (--cni-netconfpath), removed at Cleanup: nerdctl writes a conflist
// there for every network it knows, and for its default network
// ("bridge": bridge nerdctl0, 10.4.0.0/24) as soon as a command needs
// one, so the default /etc/cni/net.d would get the tests' networks and
// show them the host's (a user's nerdctl, a CRI's). Tests make networks
// of their own (CreateNetwork, with a subnet of their own) and never use
// nerdctl's "bridge": its bridge and host-local pool would be the host's
// nerdctl0 and /var/lib/cni/networks/bridge. nerdctl gives its OCI hooks
// (`nerdctl internal oci-hook createRuntime|postStop`, which run CNI) the
// global flags it was given and its own environment, so the hooks see the
// same containerd, data root and CNI directories.

package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// CocoonRuntime is Cocoon's runtime name, the runtime Nerdctl's run and
// create use unless told otherwise.
const CocoonRuntime = "io.containerd.cocoon.v2"

// CNIPath is where Debian's containernetworking-plugins installs the CNI
// plugins.
const CNIPath = "/usr/lib/cni"

// nerdctlDir holds the nerdctl that `make test-deps` builds;
// COCOON_NERDCTL names another directory holding one.
const (
	nerdctlDir    = "/opt/cocoon-test/nerdctl-1.7/bin"
	nerdctlEnvVar = "COCOON_NERDCTL"
)

// nerdctlSnapshotter is the snapshotter nerdctl unpacks images into and
// makes containers' roots with: containerd's default, the one ctr's
// import unpacks into, so that ctr and nerdctl share an image's layers.
const nerdctlSnapshotter = "overlayfs"

// cniStateDir is where the CNI plugins keep their state on the host:
// host-local's address pools (networks/<network>) and libcni's results
// (results/<network>-<id>-<ifname>).
const cniStateDir = "/var/lib/cni"

// ErrNerdctlNotInstalled is returned by NewNerdctl when nerdctl or the
// CNI plugins are not on this machine; the tests skip on it.
var ErrNerdctlNotInstalled = errors.New("nerdctl not installed")

// Nerdctl runs nerdctl against one containerd, in its namespace, with a
// data root and CNI config directory of its own. The images that ctr
// imported into the namespace (ImportBusybox) are nerdctl's by the same
// reference; ctr's import unpacks them for overlayfs, and nerdctl would
// unpack one that is not before using it.
type Nerdctl struct {
	// Bin is the nerdctl binary.
	Bin string
	// Address is the containerd's socket, Namespace the containerd
	// namespace of nerdctl's containers and images: those of the
	// Containerd, so that the images ctr imported are nerdctl's too.
	Address   string
	Namespace string
	// Dir holds everything of this Nerdctl: DataRoot (--data-root),
	// NetConfPath (--cni-netconfpath) and the path of an absent
	// nerdctl.toml (NERDCTL_TOML), so that the host's
	// /etc/nerdctl/nerdctl.toml is not read.
	Dir         string
	DataRoot    string
	NetConfPath string
	// Runtime is what run and create use when their arguments name none:
	// CocoonRuntime unless changed.
	Runtime string
	// Timeout bounds each Run: two minutes unless changed.
	Timeout time.Duration
	// Env is added to nerdctl's environment, which its OCI hooks get too.
	Env []string

	// t is the test that made it, nil outside tests.
	t testing.TB
	// netnsBefore are the entries of /run/netns when it was made, which
	// Leftovers does not count.
	netnsBefore map[string]bool
	// mu guards networks and netSeq.
	mu sync.Mutex
	// networks are the networks CreateNetwork made, by name, with their
	// subnets and bridge, for Cleanup and Leftovers.
	networks map[string]nerdctlNetwork
	// netSeq numbers the networks CreateNetwork names.
	netSeq int
	// cleanOnce makes Cleanup run once; cleanErr is what it returned.
	cleanOnce sync.Once
	cleanErr  error
}

// nerdctlNetwork is a network CreateNetwork made.
type nerdctlNetwork struct {
	// bridge is its bridge on the host; subnets are its IPv4 and IPv6
	// subnets.
	bridge  string
	subnets []*net.IPNet
}

// NewNerdctl returns a Nerdctl bound to c (which StartContainerd
// started) and runs its Cleanup when the test ends, before c stops. It
// skips the test if nerdctl or the CNI plugins are not installed.
func NewNerdctl(t testing.TB, c *Containerd) *Nerdctl {
	t.Helper()
	n, err := OpenNerdctl(c)
	if errors.Is(err, ErrNerdctlNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	n.t = t
	t.Cleanup(func() {
		if err := n.Cleanup(); err != nil {
			t.Errorf("nerdctl cleanup: %v", err)
		}
	})
	return n
}

// OpenNerdctl is NewNerdctl for programs that are not tests: the caller
// must call Cleanup before c stops.
func OpenNerdctl(c *Containerd) (*Nerdctl, error) {
	tools, err := testToolDir(nerdctlDir, nerdctlEnvVar, ErrNerdctlNotInstalled, "nerdctl")
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(tools, "nerdctl")
	for _, plugin := range []string{"bridge", "host-local", "portmap", "firewall", "tuning", "loopback"} {
		if _, err := os.Stat(filepath.Join(CNIPath, plugin)); err != nil {
			return nil, fmt.Errorf("%w: CNI plugin %s: %v (install containernetworking-plugins: make test-deps)", ErrNerdctlNotInstalled, plugin, err)
		}
	}
	dir, err := os.MkdirTemp("", "nerdctl-")
	if err != nil {
		return nil, err
	}
	n := &Nerdctl{
		Bin:         bin,
		Address:     c.Address,
		Namespace:   c.Namespace,
		Dir:         dir,
		DataRoot:    filepath.Join(dir, "data"),
		NetConfPath: filepath.Join(dir, "net.d"),
		Runtime:     CocoonRuntime,
		Timeout:     2 * time.Minute,
		netnsBefore: map[string]bool{},
		networks:    map[string]nerdctlNetwork{},
	}
	for _, d := range []string{n.DataRoot, n.NetConfPath} {
		if err := os.Mkdir(d, 0o700); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		n.netnsBefore[e.Name()] = true
	}
	return n, nil
}

// GlobalFlags are the flags every nerdctl command gets before its
// subcommand, and which nerdctl passes on to its OCI hooks.
func (n *Nerdctl) GlobalFlags() []string {
	return []string{
		"--address", n.Address,
		"--namespace", n.Namespace,
		"--data-root", n.DataRoot,
		"--cni-path", CNIPath,
		"--cni-netconfpath", n.NetConfPath,
		"--snapshotter", nerdctlSnapshotter,
		// What ctr gives a container (/<namespace>/<id>), whether or
		// not the host runs systemd.
		"--cgroup-manager", "cgroupfs",
	}
}

// Command returns a nerdctl command with args (after GlobalFlags, with
// Runtime and --pull never added to a run or create, see Args), bound
// to ctx.
func (n *Nerdctl) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, n.Bin, append(n.GlobalFlags(), n.Args(args)...)...)
	cmd.Env = append(os.Environ(), "NERDCTL_TOML="+filepath.Join(n.Dir, "nerdctl.toml"))
	cmd.Env = append(cmd.Env, n.Env...)
	// Its own process group, so that a timeout ends what it started
	// (`nerdctl run` in the foreground, a hook).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A process it started that keeps its stdout open does not hold
	// Run for ever.
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// Args is args as Command runs them: a run or create (also as
// `container run|create`) gets --runtime Runtime unless it names a
// runtime, and --pull never unless it says how to pull, so that an image
// missing from the namespace fails at once instead of being looked for
// in a registry. The flags are looked for in all of args, the container's
// command too.
func (n *Nerdctl) Args(args []string) []string {
	i := 0
	if len(args) > 0 && args[0] == "container" {
		i = 1
	}
	if len(args) <= i || (args[i] != "run" && args[i] != "create") {
		return args
	}
	var add []string
	if n.Runtime != "" && !hasFlag(args[i+1:], "--runtime") {
		add = append(add, "--runtime", n.Runtime)
	}
	if !hasFlag(args[i+1:], "--pull") {
		add = append(add, "--pull", "never")
	}
	out := append([]string(nil), args[:i+1]...)
	out = append(out, add...)
	return append(out, args[i+1:]...)
}

// hasFlag reports whether args has the long flag name, as "name value"
// or "name=value".
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// Run runs nerdctl with args (see Command) for Timeout at most, and
// returns its stdout and stderr. On failure the error carries stderr and
// wraps the *exec.ExitError.
func (n *Nerdctl) Run(args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), n.Timeout)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := n.Command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err = cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w after %v", ctx.Err(), n.Timeout)
		}
		err = fmt.Errorf("nerdctl %s: %w\n%s", strings.Join(n.Args(args), " "), err, errb.String())
	}
	return out.String(), errb.String(), err
}

// MustRun is Run that fails the test on error and returns stdout; only
// for a Nerdctl that NewNerdctl made.
func (n *Nerdctl) MustRun(args ...string) string {
	n.t.Helper()
	out, _, err := n.Run(args...)
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

// CreateNetwork makes a bridge network with `nerdctl network create`
// and the extra flags (a test gives it a subnet of its own: "--subnet",
// "10.210.0.0/24", and for IPv6 also "--ipv6", "--subnet",
// "fd00:210::/64"), named for this process so that it collides with no
// other's, and returns its name. Cleanup removes it. Its containers get
// no IPv6 default route (nerdctl 1.7.7 routes 0.0.0.0/0 only), so a port
// published on IPv6 (-p :::8080:80) answers only peers of the subnet.
func (n *Nerdctl) CreateNetwork(flags ...string) (string, error) {
	n.mu.Lock()
	n.netSeq++
	name := fmt.Sprintf("cocoon-%d-%d", os.Getpid(), n.netSeq)
	n.mu.Unlock()
	args := append([]string{"network", "create", "--driver", "bridge"}, flags...)
	if _, _, err := n.Run(append(args, name)...); err != nil {
		return "", err
	}
	nw, err := n.inspectNetwork(name)
	n.mu.Lock()
	n.networks[name] = nw
	n.mu.Unlock()
	if err != nil {
		return "", err
	}
	return name, nil
}

// MustCreateNetwork is CreateNetwork that fails the test on error.
func (n *Nerdctl) MustCreateNetwork(flags ...string) string {
	n.t.Helper()
	name, err := n.CreateNetwork(flags...)
	if err != nil {
		n.t.Fatal(err)
	}
	return name
}

// inspectNetwork reads network name's bridge and subnets from its
// conflist, which CreateNetwork's nerdctl wrote.
func (n *Nerdctl) inspectNetwork(name string) (nerdctlNetwork, error) {
	var nw nerdctlNetwork
	data, err := os.ReadFile(filepath.Join(n.NetConfPath, "nerdctl-"+name+".conflist"))
	if err != nil {
		return nw, err
	}
	var conf struct {
		Plugins []struct {
			Type   string `json:"type"`
			Bridge string `json:"bridge"`
			IPAM   struct {
				Ranges [][]struct {
					Subnet string `json:"subnet"`
				} `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		return nw, fmt.Errorf("network %s: %w", name, err)
	}
	for _, p := range conf.Plugins {
		if p.Type != "bridge" {
			continue
		}
		nw.bridge = p.Bridge
		for _, r := range p.IPAM.Ranges {
			for _, s := range r {
				if _, subnet, err := net.ParseCIDR(s.Subnet); err == nil {
					nw.subnets = append(nw.subnets, subnet)
				}
			}
		}
	}
	if nw.bridge == "" {
		return nw, fmt.Errorf("network %s: no bridge plugin in %s", name, data)
	}
	return nw, nil
}

// Cleanup removes the containers nerdctl made in the namespace (rm -f:
// their poststop hooks release their addresses), then the networks
// CreateNetwork made, with their bridges, host-local pools and what
// iptables keeps of them (see removeRules), then Dir. It is safe to call
// more than once.
func (n *Nerdctl) Cleanup() error {
	n.cleanOnce.Do(func() { n.cleanErr = n.cleanup() })
	return n.cleanErr
}

func (n *Nerdctl) cleanup() error {
	var errs []error
	// nerdctl's containers are those with its state-dir label; ctr's in
	// the same namespace are the Containerd's users' to remove.
	out, _, err := n.Run("ps", "-a", "-q", "--no-trunc", "--filter", "label=nerdctl/state-dir")
	if err != nil {
		errs = append(errs, err)
	}
	if ids := strings.Fields(out); len(ids) > 0 {
		if _, _, err := n.Run(append([]string{"rm", "-f"}, ids...)...); err != nil {
			errs = append(errs, err)
		}
	}
	n.mu.Lock()
	names := make([]string, 0, len(n.networks))
	for name := range n.networks {
		names = append(names, name)
	}
	n.mu.Unlock()
	sort.Strings(names)
	for _, name := range names {
		if _, _, err := n.Run("network", "rm", name); err != nil {
			errs = append(errs, err)
		}
		// nerdctl leaves host-local's pool directory (its lock and last
		// address) and iptables rules; the name is this Nerdctl's.
		if err := os.RemoveAll(filepath.Join(cniStateDir, "networks", name)); err != nil {
			errs = append(errs, err)
		}
		n.mu.Lock()
		nw := n.networks[name]
		n.mu.Unlock()
		if err := removeRules(name, nw); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(n.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", n.Dir, err))
	}
	return errors.Join(errs...)
}

// Leftovers describes what the containers of this Nerdctl left on the
// host after their removal (`nerdctl rm -f`), one finding a line, ""
// when nothing:
//   - taps named cctap* in any network namespace, and tc ingress qdiscs
//     and filters (Cocoon's redirects) in any namespace but the host's;
//   - virtiofsd and cocoon-netns-holder processes of the shims of
//     stateDir (their state directory, /run/cocoon by default; see
//     processLeftovers);
//   - mounts under stateDir or Dir (a namespace file is one), and entries
//     of /run/netns made since the Nerdctl was;
//   - of the networks CreateNetwork made: links on their bridges,
//     iptables rules that name them or their subnets, host-local
//     addresses still allocated and CNI results still cached; but not
//     the masquerade rules that nerdctl leaves whatever the runtime (see
//     masquerade), which Cleanup removes.
func (n *Nerdctl) Leftovers(stateDir string) string {
	var found []string
	found = append(found, namespaceLeftovers()...)
	found = append(found, processLeftovers(stateDir, "virtiofsd", "cocoon-netns-holder")...)
	found = append(found, n.fileLeftovers(stateDir)...)
	found = append(found, n.networkLeftovers()...)
	return strings.Join(found, "\n")
}

// namespaceLeftovers lists the cctap* links of every network namespace
// on the host, and the ingress qdiscs and filters of every one but the
// host's own.
func namespaceLeftovers() []string {
	var found []string
	self, err := nsID("/proc/self/ns/net")
	if err != nil {
		return []string{fmt.Sprintf("the host's network namespace: %v", err)}
	}
	for id, path := range netNamespaces() {
		ns, err := netns.GetFromPath(path)
		if err != nil {
			continue // gone meanwhile
		}
		h, err := netlink.NewHandleAt(ns)
		ns.Close()
		if err != nil {
			continue
		}
		links, _ := h.LinkList()
		for _, l := range links {
			name := l.Attrs().Name
			if strings.HasPrefix(name, "cctap") {
				found = append(found, fmt.Sprintf("tap %s in network namespace %s", name, path))
			}
			if id == self {
				continue
			}
			qdiscs, _ := h.QdiscList(l)
			for _, q := range qdiscs {
				if q.Type() == "ingress" {
					found = append(found, fmt.Sprintf("ingress qdisc on %s in network namespace %s", name, path))
				}
			}
			filters, _ := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
			for _, f := range filters {
				found = append(found, fmt.Sprintf("tc %s filter on %s ingress in network namespace %s", f.Type(), name, path))
			}
		}
		h.Close()
	}
	sort.Strings(found)
	return found
}

// netNamespaces finds the host's network namespaces, by their identity
// (device and inode): each with one path that opens it, looked for in
// /proc/self/ns/net, the namespace bind mounts (of /run/netns and any
// other) and every process's /proc/<pid>/ns/net.
func netNamespaces() map[string]string {
	paths := []string{"/proc/self/ns/net"}
	if ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("nsfs")); err == nil {
		for _, m := range ms {
			paths = append(paths, m.Mountpoint)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	paths = append(paths, procs...)
	found := map[string]string{}
	for _, p := range paths {
		id, err := nsID(p)
		if err != nil {
			continue
		}
		if _, ok := found[id]; !ok {
			found[id] = p
		}
	}
	return found
}

// nsID is the identity of the namespace file at path: its device and
// inode.
func nsID(path string) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}

// processLeftovers lists the processes whose program (argv[0]'s base
// name) is one of names and that belong to the shims of stateDir: a
// command line that mentions it (virtiofsd's source), or the shim's
// COCOON_STATE_DIR in the environment (which a holder, re-executed from
// the shim, inherits; unset means the default, /run/cocoon).
func processLeftovers(stateDir string, names ...string) []string {
	var found []string
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		data, err := os.ReadFile(p)
		if err != nil || len(data) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if !slices.Contains(names, filepath.Base(args[0])) {
			continue
		}
		pid := filepath.Base(filepath.Dir(p))
		if ownedBy(pid, args, stateDir) {
			found = append(found, fmt.Sprintf("process %s: %s", pid, strings.Join(args, " ")))
		}
	}
	sort.Strings(found)
	return found
}

// defaultStateDir is the shims' state directory when COCOON_STATE_DIR
// is not set (runtime/config).
const defaultStateDir = "/run/cocoon"

// ownedBy reports whether process pid, of command line args, belongs to
// the shims of stateDir (see processLeftovers).
func ownedBy(pid string, args []string, stateDir string) bool {
	if stateDir == "" {
		stateDir = defaultStateDir
	}
	for _, a := range args {
		if strings.Contains(a+"/", stateDir+"/") {
			return true
		}
	}
	env, err := os.ReadFile(filepath.Join("/proc", pid, "environ"))
	if err != nil {
		return false
	}
	dir := defaultStateDir
	for _, kv := range strings.Split(string(env), "\x00") {
		if v, ok := strings.CutPrefix(kv, "COCOON_STATE_DIR="); ok && v != "" {
			dir = v
		}
	}
	return filepath.Clean(dir) == filepath.Clean(stateDir)
}

// fileLeftovers lists the mounts under stateDir or Dir (a namespace
// file is an nsfs mount) and the entries of /run/netns made since this
// Nerdctl was.
func (n *Nerdctl) fileLeftovers(stateDir string) []string {
	var found []string
	if ms, err := mountinfo.GetMounts(nil); err == nil {
		for _, m := range ms {
			for _, dir := range []string{stateDir, n.Dir} {
				if dir != "" && (m.Mountpoint == dir || strings.HasPrefix(m.Mountpoint, dir+"/")) {
					found = append(found, fmt.Sprintf("%s mount at %s", m.FSType, m.Mountpoint))
				}
			}
		}
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if !n.netnsBefore[e.Name()] {
			found = append(found, "network namespace file /run/netns/"+e.Name())
		}
	}
	sort.Strings(found)
	return found
}

// networkLeftovers lists, for each network CreateNetwork made, the links
// attached to its bridge, the iptables rules that name it or one of its
// subnets, and what CNI keeps on the host for its containers.
func (n *Nerdctl) networkLeftovers() []string {
	n.mu.Lock()
	networks := make(map[string]nerdctlNetwork, len(n.networks))
	for name, nw := range n.networks {
		networks[name] = nw
	}
	n.mu.Unlock()
	if len(networks) == 0 {
		return nil
	}
	var found []string
	links, _ := netlink.LinkList()
	bridges := map[int]string{}
	for _, l := range links {
		for name, nw := range networks {
			if l.Attrs().Name == nw.bridge {
				bridges[l.Attrs().Index] = name
			}
		}
	}
	for _, l := range links {
		if name, ok := bridges[l.Attrs().MasterIndex]; ok {
			found = append(found, fmt.Sprintf("link %s on the bridge %s of network %s", l.Attrs().Name, networks[name].bridge, name))
		}
	}
	for _, r := range iptablesRules() {
		if r.masquerade() {
			continue // nerdctl's own leak, which Cleanup removes
		}
		for name, nw := range networks {
			if r.names(name) || ruleInSubnets(r.args, nw.subnets) {
				found = append(found, fmt.Sprintf("%s -t %s rule of network %s: %s", r.cmd, r.table, name, r.line))
				break
			}
		}
	}
	for name := range networks {
		ents, _ := os.ReadDir(filepath.Join(cniStateDir, "networks", name))
		for _, e := range ents {
			if e.Name() != "lock" && !strings.HasPrefix(e.Name(), "last_reserved_ip") {
				found = append(found, fmt.Sprintf("address %s of network %s still allocated", e.Name(), name))
			}
		}
		results, _ := filepath.Glob(filepath.Join(cniStateDir, "results", name+"-*"))
		for _, r := range results {
			found = append(found, "CNI result cached: "+r)
		}
	}
	sort.Strings(found)
	return found
}

// ruleInSubnets reports whether an iptables rule has an address (-s,
// -d, --to-destination) in one of subnets.
func ruleInSubnets(args []string, subnets []*net.IPNet) bool {
	for _, w := range args {
		if host, _, err := net.SplitHostPort(w); err == nil {
			w = strings.Trim(host, "[]")
		}
		if i := strings.IndexByte(w, '/'); i >= 0 {
			w = w[:i]
		}
		ip := net.ParseIP(w)
		if ip == nil {
			continue
		}
		for _, s := range subnets {
			if s.Contains(ip) {
				return true
			}
		}
	}
	return false
}

// iptablesRule is one rule of `iptables -S`.
type iptablesRule struct {
	// cmd is iptables or ip6tables, table the rule's table, chain its
	// chain.
	cmd, table, chain string
	// args are the rule's words after "-A <chain>", unquoted; line is the
	// rule as printed.
	args []string
	line string
}

// iptablesRules lists the rules of the tables the CNI plugins write to
// (filter and nat) and of raw, where dockerd drops what comes to a
// container's address or a port published on 127.0.0.1 from elsewhere;
// IPv4 and IPv6.
func iptablesRules() []iptablesRule {
	var rules []iptablesRule
	for _, cmd := range []string{"iptables", "ip6tables"} {
		for _, table := range []string{"filter", "nat", "raw"} {
			out, err := exec.Command(cmd, "-w", "-t", table, "-S").Output()
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(out), "\n") {
				w := splitRule(line)
				if len(w) < 2 || w[0] != "-A" {
					continue
				}
				rules = append(rules, iptablesRule{cmd: cmd, table: table, chain: w[1], args: w[2:], line: line})
			}
		}
	}
	return rules
}

// splitRule splits a line of `iptables -S` into its words: a word in
// double quotes (a comment) is one, with its \" and \\ unescaped.
func splitRule(line string) []string {
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\\' && i+1 < len(line):
			i++
			w.WriteByte(line[i])
		case c == '"':
			quoted, inWord = !quoted, true
		case !quoted && (c == ' ' || c == '\t'):
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// names reports whether the rule is CNI's for network name: a comment
// of the bridge or portmap plugin naming it.
func (r iptablesRule) names(network string) bool {
	for _, a := range r.args {
		if strings.Contains(a, `name: "`+network+`"`) {
			return true
		}
	}
	return false
}

// masqChain matches the name of the chain the bridge plugin makes for a
// container's masquerading: CNI- and 24 hex digits of a hash of the
// network's name and the container's id.
var masqChain = regexp.MustCompile(`^CNI-[0-9a-f]{24}$`)

// masquerade reports whether the rule is the bridge plugin's ipMasq for
// a container: in its chain, or POSTROUTING's jump to it. nerdctl 1.7.7's
// postStop hook runs CNI's DEL without the container's network namespace,
// and the bridge plugin (1.1.1) then releases the address but keeps
// these, with runc as with any runtime.
func (r iptablesRule) masquerade() bool {
	if r.table != "nat" {
		return false
	}
	if masqChain.MatchString(r.chain) {
		return true
	}
	for i, a := range r.args {
		if a == "-j" && i+1 < len(r.args) && r.chain == "POSTROUTING" && masqChain.MatchString(r.args[i+1]) {
			return true
		}
	}
	return false
}

// removeRules deletes what the CNI plugins left in iptables of network
// name once it is removed: the masquerade chains of its containers (see
// masquerade) with POSTROUTING's jumps to them, and the firewall plugin's
// isolation rules naming its bridge. The plugins' chains that every
// network shares (CNI-FORWARD, CNI-HOSTPORT-DNAT, ...) stay: they are
// the host's, whatever else uses them.
func removeRules(name string, nw nerdctlNetwork) error {
	var errs []error
	chains := map[[3]string]bool{}
	for _, r := range iptablesRules() {
		ours := r.names(name)
		for i, a := range r.args {
			if (a == "-i" || a == "-o") && i+1 < len(r.args) && r.args[i+1] == nw.bridge {
				ours = true
			}
		}
		if !ours {
			continue
		}
		if r.masquerade() && masqChain.MatchString(r.chain) {
			chains[[3]string{r.cmd, r.table, r.chain}] = true
			continue
		}
		args := append([]string{"-w", "-t", r.table, "-D", r.chain}, r.args...)
		if out, err := exec.Command(r.cmd, args...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %v: %s", r.cmd, strings.Join(args, " "), err, out))
		}
	}
	for c := range chains {
		for _, op := range []string{"-F", "-X"} {
			if out, err := exec.Command(c[0], "-w", "-t", c[1], op, c[2]).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s -t %s %s %s: %v: %s", c[0], c[1], op, c[2], err, out))
			}
		}
	}
	return errors.Join(errs...)
}
