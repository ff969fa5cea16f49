package integration

import (
	"regexp"
	"strings"
	"testing"
)

// TestShimPids: the task's pid (`ctr task ls`, QEMU's host pid) is among
// the pids `ctr task ps` lists, standing for the container's init, as
// containerd's client expects of runc; the other processes are listed by
// their guest pids, and an exec's entry names its exec id.
func TestShimPids(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "pids")
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "pids", "sh", "-c", "sleep 600 & wait")
			c.WaitStatus(t, "pids", "RUNNING")
			c.MustCtr("task", "exec", "-d", "--exec-id", "sleeper", "pids", "sleep", "600")
			waitPids(t, c, "pids", 3)
			m := regexp.MustCompile(`(?m)^pids\s+(\d+)\s`).FindStringSubmatch(c.MustCtr("task", "ls"))
			if m == nil {
				t.Fatal("no pid for the task in ctr task ls")
			}
			taskPid := m[1]
			ps := c.MustCtr("task", "ps", "pids")
			t.Logf("task pid %s; ctr task ps:\n%s", taskPid, ps)
			var found bool
			var execInfo string
			for _, line := range strings.Split(ps, "\n") {
				f := strings.Fields(line)
				if len(f) == 0 {
					continue
				}
				if f[0] == taskPid {
					found = true
				}
				if strings.Contains(line, "sleeper") {
					execInfo = line
				}
			}
			if !found {
				t.Errorf("the task's pid %s is not among the pids:\n%s", taskPid, ps)
			}
			if execInfo == "" {
				t.Errorf("no entry names the exec sleeper:\n%s", ps)
			}
			killAndRemove(t, c, "pids")
		})
	}
}
