package hostcgroup

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// onDisk are the limits that the files of the cgroup at p say, in
// Limits' terms (a cap that is not there is 0); CPUShares is cpu.weight
// on v2.
func onDisk(t *testing.T, lay layout, p string) Limits {
	t.Helper()
	hs, _, err := lay.hierarchies(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	file := func(hierarchy, name string) string {
		for _, h := range hs {
			if h.name == hierarchy {
				return filepath.Join(h.dir, name)
			}
		}
		t.Fatalf("no %s hierarchy", hierarchy)
		return ""
	}
	num := func(file string) int64 {
		v, err := readInt(file)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	capped := func(v int64) int64 { return max(v, 0) }
	var l Limits
	if lay.v1 {
		if m := num(file("memory", "memory.limit_in_bytes")); m < 1<<62 {
			l.MemoryBytes = m
		}
		l.CPUQuota = capped(num(file("cpu", "cpu.cfs_quota_us")))
		l.CPUPeriod = uint64(num(file("cpu", "cpu.cfs_period_us")))
		l.CPUShares = uint64(num(file("cpu", "cpu.shares")))
		l.Pids = capped(num(file("pids", "pids.max")))
		return l
	}
	l.MemoryBytes = capped(num(file("unified", "memory.max")))
	b, err := os.ReadFile(file("unified", "cpu.max"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if f[0] != "max" {
		l.CPUQuota, _ = strconv.ParseInt(f[0], 10, 64)
	}
	l.CPUPeriod, _ = strconv.ParseUint(f[1], 10, 64)
	l.CPUShares = uint64(num(file("unified", "cpu.weight")))
	l.Pids = capped(num(file("unified", "pids.max")))
	return l
}

// want is what onDisk reads once l is in force.
func want(lay layout, l Limits) Limits {
	l.CPUPeriod, l.CPUShares = l.period(), l.shares()
	if !lay.v1 {
		l.CPUShares = cgroup2.ConvertCPUSharesToCgroupV2Value(l.CPUShares)
	}
	return l
}

// TestJoinUpdateLeave runs Join, Update and Leave in a process of their
// own, as the shim does: the process and all its threads go in, the
// limits are written, changed and lifted, and Leave puts the process
// back and removes the group from every hierarchy, and nothing else.
func TestJoinUpdateLeave(t *testing.T) {
	lay := needHost(t)
	parent := testParent(t, lay)
	h := startHelper(t)
	pid := h.cmd.Process.Pid
	before := cgroupOf(t, pid)

	p := parent + "/pod1/sandbox"
	first := LimitsForVM(256, 2, 64)
	first.Pids = 100
	h.ok(t, "join %s %s", p, limitArgs(first))
	inGroup(t, lay, pid, p)
	if got := onDisk(t, lay, p); got != want(lay, first) {
		t.Errorf("after Join the files say %+v, want %+v", got, want(lay, first))
	}

	// The child of a joined process is in the group too.
	child, _ := strconv.Atoi(h.ok(t, "spawn"))
	inGroup(t, lay, child, p)
	unix.Kill(child, unix.SIGKILL)

	second := Limits{MemoryBytes: 512 << 20, CPUQuota: 50000, CPUPeriod: 50000, CPUShares: 512}
	h.ok(t, "update %s", limitArgs(second))
	if got := onDisk(t, lay, p); got != want(lay, second) {
		t.Errorf("after Update the files say %+v, want %+v", got, want(lay, second))
	}
	h.ok(t, "update %s", limitArgs(Limits{}))
	if got := onDisk(t, lay, p); got != want(lay, Limits{}) {
		t.Errorf("after Update with no limits the files say %+v, want %+v", got, want(lay, Limits{}))
	}

	hs, _, _ := lay.hierarchies(p, 0)
	for _, d := range hs {
		waitGone(t, d.dir, child)
	}
	h.ok(t, "leave")
	if after := cgroupOf(t, pid); after != before {
		t.Errorf("after Leave the process is in\n%s\nnot where it was:\n%s", after, before)
	}
	gone(t, lay, p)
	// Only the group goes, not its parents.
	for _, d := range hs {
		if _, err := os.Stat(filepath.Dir(d.dir)); err != nil {
			t.Errorf("the group's parent is gone: %v", err)
		}
	}
	if got := h.do(t, "update %s", limitArgs(first)); !strings.HasPrefix(got, "err failed-precondition") {
		t.Errorf("Update after Leave: %s", got)
	}
	if got := h.do(t, "leave"); !strings.HasPrefix(got, "err failed-precondition") || !strings.Contains(got, "already") {
		t.Errorf("Leave after Leave: %s", got)
	}
}

// TestLeaveToAncestor: Leave moves the process to the nearest ancestor
// of a cgroup it came from that is gone since.
func TestLeaveToAncestor(t *testing.T) {
	lay := needHost(t)
	parent := testParent(t, lay)
	h := startHelper(t)
	pid := h.cmd.Process.Pid
	origin, err := join(parent+"/origin", Limits{}, pid, lay)
	if err != nil {
		t.Fatal(err)
	}
	h.ok(t, "join %s %s", parent+"/sandbox", limitArgs(Limits{}))
	if err := remove(origin.path, origin.hierarchies); err != nil {
		t.Fatal(err)
	}
	h.ok(t, "leave")
	inGroup(t, lay, pid, parent)
	gone(t, lay, parent+"/sandbox")
	// Out of parent, for its cleanup.
	if err := move(origin.hierarchies, pid, false); err != nil {
		t.Fatal(err)
	}
}

// TestJoinSystemdPath joins the path that systemd's form names, through
// cgroupfs.
func TestJoinSystemdPath(t *testing.T) {
	lay := needHost(t)
	// A slice of the test's own, with no dash: one level.
	slice := testParentNamed(t, lay, "/cocoontest%s.slice")
	spec := slice[1:] + ":cri-containerd:abcd"
	p, err := Resolve(spec)
	if err != nil {
		t.Fatal(err)
	}
	if want := slice + "/cri-containerd-abcd.scope"; p != want {
		t.Fatalf("Resolve(%q) = %q, want %q", spec, p, want)
	}
	h := startHelper(t)
	h.ok(t, "join %s %s", spec, limitArgs(LimitsForVM(128, 1, 0)))
	inGroup(t, lay, h.cmd.Process.Pid, p)
	if got := onDisk(t, lay, p); got != want(lay, LimitsForVM(128, 1, 0)) {
		t.Errorf("the files say %+v, want %+v", got, want(lay, LimitsForVM(128, 1, 0)))
	}
	h.ok(t, "leave")
	gone(t, lay, p)
}

// TestJoinRefusesMemoryBelowUse: a limit below what the process has
// resident is refused, and the process stays, the group is not made.
func TestJoinRefusesMemoryBelowUse(t *testing.T) {
	lay := needHost(t)
	parent := testParent(t, lay)
	h := startHelper(t)
	before := cgroupOf(t, h.cmd.Process.Pid)
	h.ok(t, "alloc 64")
	p := parent + "/pod/sandbox"
	got := h.do(t, "join %s %s", p, limitArgs(Limits{MemoryBytes: 16 << 20}))
	if !strings.HasPrefix(got, "err failed-precondition") || !strings.Contains(got, "16 MiB") {
		t.Errorf("Join with 16 MiB for a process of 64: %s", got)
	}
	if after := cgroupOf(t, h.cmd.Process.Pid); after != before {
		t.Errorf("after a failed Join the process is in\n%s\nnot where it was:\n%s", after, before)
	}
	gone(t, lay, p)
	gone(t, lay, parent+"/pod")
}

// TestUpdateRefusesMemoryBelowUse: the memory charged to the group since
// Join is checked before a lower limit is written.
func TestUpdateRefusesMemoryBelowUse(t *testing.T) {
	lay := needHost(t)
	parent := testParent(t, lay)
	h := startHelper(t)
	p := parent + "/sandbox"
	h.ok(t, "join %s %s", p, limitArgs(Limits{MemoryBytes: 1 << 30}))
	h.ok(t, "alloc 64")
	got := h.do(t, "update %s", limitArgs(Limits{MemoryBytes: 16 << 20}))
	if !strings.HasPrefix(got, "err failed-precondition") || !strings.Contains(got, "the group uses") {
		t.Errorf("Update to 16 MiB of a group using 64: %s", got)
	}
	if l := onDisk(t, lay, p); l.MemoryBytes != 1<<30 {
		t.Errorf("after a refused Update the memory limit is %d, want %d", l.MemoryBytes, 1<<30)
	}
	h.ok(t, "leave")
	gone(t, lay, p)
}

// TestLeaveLeavesBusyGroup: a process still in the group (a VMM that has
// not ended) keeps it; Leave says which, moves the caller back all the
// same and removes the group when called again once it has ended.
func TestLeaveLeavesBusyGroup(t *testing.T) {
	lay := needHost(t)
	parent := testParent(t, lay)
	h := startHelper(t)
	before := cgroupOf(t, h.cmd.Process.Pid)
	p := parent + "/sandbox"
	h.ok(t, "join %s %s", p, limitArgs(Limits{}))
	child, _ := strconv.Atoi(h.ok(t, "spawn"))
	got := h.do(t, "leave")
	if !strings.HasPrefix(got, "err failed-precondition") || !strings.Contains(got, strconv.Itoa(child)+" (sleep)") {
		t.Errorf("Leave with a sleep (%d) in the group: %s", child, got)
	}
	if after := cgroupOf(t, h.cmd.Process.Pid); after != before {
		t.Errorf("after Leave the process is in\n%s\nnot where it was:\n%s", after, before)
	}
	inGroup(t, lay, child, p)
	unix.Kill(child, unix.SIGKILL)
	hs, _, _ := lay.hierarchies(p, 0)
	for _, d := range hs {
		waitGone(t, d.dir, child)
	}
	h.ok(t, "leave")
	gone(t, lay, p)
}

// TestRemove removes a group that another process joined, once it is
// empty, and kills nothing.
func TestRemove(t *testing.T) {
	lay := needHost(t)
	parent := testParent(t, lay)
	pid := sleeper(t)
	p := parent + "/sandbox"
	if _, err := join(p, Limits{}, pid, lay); err != nil {
		t.Fatal(err)
	}
	err := Remove(p)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), strconv.Itoa(pid)+" (sleep)") {
		t.Errorf("Remove of a group with a sleep (%d) in it: %v", pid, err)
	}
	if unix.Kill(pid, 0) != nil {
		t.Error("Remove killed the sleep")
	}
	inGroup(t, lay, pid, p)
	unix.Kill(pid, unix.SIGKILL)
	hs, _, _ := lay.hierarchies(p, 0)
	for _, d := range hs {
		waitGone(t, d.dir, pid)
	}
	if err := Remove(p); err != nil {
		t.Fatal(err)
	}
	gone(t, lay, p)
	if err := Remove(p); err != nil {
		t.Errorf("Remove of a group that is gone: %v", err)
	}
	if err := Remove("/"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Remove of the root: %v", err)
	}
}

// TestJoinRefusesOccupiedGroup: a group that holds a process already is
// another's; an empty one (left by a crash) is used.
func TestJoinRefusesOccupiedGroup(t *testing.T) {
	lay := needHost(t)
	parent := testParent(t, lay)
	p := parent + "/sandbox"
	first := sleeper(t)
	g, err := join(p, Limits{}, first, lay)
	if err != nil {
		t.Fatal(err)
	}
	second := sleeper(t)
	_, err = join(p, Limits{}, second, lay)
	if !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), strconv.Itoa(first)) {
		t.Errorf("Join of a group that holds %d: %v", first, err)
	}
	inGroup(t, lay, first, p)
	if err := g.Leave(); err != nil {
		t.Fatal(err)
	}

	// Left behind empty, with stale limits: used, with the new ones.
	hs, _, _ := lay.hierarchies(p, 0)
	for _, h := range hs {
		if err := os.MkdirAll(h.dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if lay.v1 {
		for _, h := range hs {
			if h.name == "memory" {
				os.WriteFile(filepath.Join(h.dir, "memory.limit_in_bytes"), []byte("67108864"), 0)
			}
		}
	}
	g, err = join(p, Limits{}, second, lay)
	if err != nil {
		t.Fatal(err)
	}
	if got := onDisk(t, lay, p); got != want(lay, Limits{}) {
		t.Errorf("a reused group's files say %+v, want %+v", got, want(lay, Limits{}))
	}
	if err := g.Leave(); err != nil {
		t.Fatal(err)
	}
}

// TestCPUQuotaClampedToParent: under a pod whose cgroup has a CPU quota
// lower than the VM's, v1 kernels refuse the VM's; Join writes the pod's
// share of a CPU instead (v2 kernels cap it the same way by themselves).
func TestCPUQuotaClampedToParent(t *testing.T) {
	lay := needHost(t)
	if !lay.v1 {
		t.Skip("the clamp is v1's; this host is cgroup v2")
	}
	parent := testParent(t, lay)
	pod := parent + "/pod"
	hs, subs, err := lay.hierarchies(pod, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newV1(pod, hs, subs); err != nil {
		t.Fatal(err)
	}
	var podCPU string
	for _, h := range hs {
		if h.name == "cpu" {
			podCPU = h.dir
		}
	}
	// Half a CPU, in a period of 200ms.
	for name, v := range map[string]string{"cpu.cfs_period_us": "200000", "cpu.cfs_quota_us": "100000"} {
		if err := os.WriteFile(filepath.Join(podCPU, name), []byte(v), 0); err != nil {
			t.Fatal(err)
		}
	}
	g, err := join(pod+"/sandbox", LimitsForVM(128, 2, 0), sleeper(t), lay)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Leave()
	if got := g.Limits().CPUQuota; got != 50000 {
		t.Errorf("quota in force %d, want half of the 100ms period, 50000", got)
	}
	if got := onDisk(t, lay, g.Path()).CPUQuota; got != 50000 {
		t.Errorf("cpu.cfs_quota_us is %d, want 50000", got)
	}
	// What the clamp avoids.
	err = os.WriteFile(filepath.Join(podCPU, "sandbox", "cpu.cfs_quota_us"), []byte("200000"), 0)
	if !errors.Is(err, unix.EINVAL) {
		t.Errorf("writing a quota above the pod's: %v, want EINVAL", err)
	}
}

// TestV2OnHybridHierarchy runs the v2 code against a hybrid host's
// controller-less v2 hierarchy, as if it were a unified host's: the
// group is made, joined and removed; a limit fails for want of its
// controller.
func TestV2OnHybridHierarchy(t *testing.T) {
	lay := needHost(t)
	if !lay.v1 || lay.unified == "" {
		t.Skip("needs a hybrid host's v2 hierarchy beside the v1 ones")
	}
	v2 := layout{unified: lay.unified}
	parent := testParent(t, v2)
	p := parent + "/sandbox"
	pid := sleeper(t)
	_, err := join(p, Limits{MemoryBytes: 1 << 30}, pid, v2)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "no memory controller") {
		t.Errorf("Join with a memory limit and no memory controller: %v", err)
	}
	gone(t, v2, p)
	g, err := join(p, Limits{}, pid, v2)
	if err != nil {
		t.Fatal(err)
	}
	inGroup(t, v2, pid, p)
	if err := g.Leave(); err != nil {
		t.Fatal(err)
	}
	gone(t, v2, p)
}
