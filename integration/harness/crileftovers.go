package harness

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/vishvananda/netlink"
)

// CRILeftovers describes what the pods of a CRI instance (WithCRI) left
// on the host once they were all removed, one finding a line, "" when
// nothing:
//   - links (the pods' veths) on the instance's bridge;
//   - mounts under the instance's directory: the pods' network
//     namespaces (under its state directory), shm, rootfs;
//   - entries of /run/netns named as CRI names them (cni-*) made since
//     the instance started;
//   - processes whose root is one of the instance's snapshots (a pause,
//     a container's process), and the instance's shims, runc's or
//     Cocoon's;
//   - cgroups under the instance's cgroup parent;
//   - iptables rules naming its network or in its subnet (portmap's),
//     host-local addresses still allocated, and CNI results still cached.
//
// A shim exits shortly after its pod is removed: a test polls.
func (c *Containerd) CRILeftovers() string {
	var found []string
	found = append(found, c.criLinkLeftovers()...)
	found = append(found, c.criFileLeftovers()...)
	found = append(found, c.criProcessLeftovers()...)
	for _, d := range c.criCgroupDirs() {
		kids, _ := filepath.Glob(filepath.Join(d, "*", "cgroup.procs"))
		for _, k := range kids {
			found = append(found, "cgroup "+filepath.Dir(k))
		}
	}
	found = append(found, c.criNetworkLeftovers()...)
	sort.Strings(found)
	return strings.Join(found, "\n")
}

// criLinkLeftovers lists the links on the instance's bridge.
func (c *Containerd) criLinkLeftovers() []string {
	br, err := netlink.LinkByName(c.CRIBridge())
	if err != nil {
		return nil // no pod ever had a network
	}
	links, _ := netlink.LinkList()
	var found []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			found = append(found, fmt.Sprintf("link %s on the bridge %s", l.Attrs().Name, c.CRIBridge()))
		}
	}
	return found
}

// criFileLeftovers lists the mounts under Dir and CRI's entries of
// /run/netns made since the instance started.
func (c *Containerd) criFileLeftovers() []string {
	var found []string
	if ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(c.Dir)); err == nil {
		for _, m := range ms {
			found = append(found, fmt.Sprintf("%s mount at %s", m.FSType, m.Mountpoint))
		}
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "cni-") && !c.cri.netnsBefore[e.Name()] {
			found = append(found, "network namespace file /run/netns/"+e.Name())
		}
	}
	return found
}

// criProcessLeftovers lists the instance's shims and the processes in
// another mount namespace whose root is an overlay mount of the
// instance's snapshots (its options name Dir).
func (c *Containerd) criProcessLeftovers() []string {
	var found []string
	for _, pid := range c.allShimPIDs() {
		found = append(found, fmt.Sprintf("shim %d still running", pid))
	}
	self, err := nsID("/proc/self/ns/mnt")
	if err != nil {
		return append(found, fmt.Sprintf("the test's mount namespace: %v", err))
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if id, err := nsID(filepath.Join(p, "ns", "mnt")); err != nil || id == self {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		ms, err := mountinfo.PidMountInfo(pid)
		if err != nil {
			continue // gone meanwhile
		}
		for _, m := range ms {
			if m.Mountpoint == "/" && strings.Contains(m.VFSOptions, c.Dir+"/") {
				cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
				found = append(found, fmt.Sprintf("process %d in a container of the instance: %s", pid, strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")))
				break
			}
		}
	}
	return found
}

// criNetworkLeftovers lists the iptables rules that name the instance's
// network or have an address in its subnet, host-local's addresses still
// allocated, and CNI's cached results of the network.
func (c *Containerd) criNetworkLeftovers() []string {
	var found []string
	name := c.CRINetwork()
	for _, r := range iptablesRules() {
		if r.names(name) || ruleInSubnets(r.args, []*net.IPNet{c.CRISubnet()}) {
			found = append(found, fmt.Sprintf("%s -t %s rule: %s", r.cmd, r.table, r.line))
		}
	}
	ents, _ := os.ReadDir(filepath.Join(c.criDir(), "ipam", name))
	for _, e := range ents {
		if e.Name() != "lock" && !strings.HasPrefix(e.Name(), "last_reserved_ip") {
			found = append(found, fmt.Sprintf("address %s of network %s still allocated", e.Name(), name))
		}
	}
	results, _ := filepath.Glob(filepath.Join(cniStateDir, "results", name+"-*"))
	for _, r := range results {
		found = append(found, "CNI result cached: "+r)
	}
	return found
}

// WaitCRIClean waits up to timeout for CRILeftovers to report nothing,
// as a removed pod's VM, namespace and CNI state go a moment after rmp
// returns; it returns what is left then, "" when nothing is.
func (c *Containerd) WaitCRIClean(timeout time.Duration) string {
	var left string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if left = c.CRILeftovers(); left == "" {
			return ""
		}
	}
	return left
}
