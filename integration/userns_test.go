package integration

import (
	"strings"
	"testing"
)

// TestShimUserNamespace runs a container in a user namespace that maps
// its root to an unprivileged uid (ctr --uidmap/--gidmap, one mapping
// each, the snapshot remapped to match): it is root in its namespace, the
// mapping is the one asked for, its files are its root's, and it can
// write to its root filesystem.
func TestShimUserNamespace(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "userns")
			out, err := c.Ctr("run", "--rm", "--runtime", runtimeName,
				"--uidmap", "0:100000:65536", "--gidmap", "0:100000:65536", img, "userns",
				"sh", "-c", "id -u; id -g; cat /proc/self/uid_map /proc/self/gid_map; stat -c %u:%g /bin/sh; echo x > /written && cat /written")
			if err != nil {
				t.Fatalf("ctr run in a user namespace: %v\n%s", err, out)
			}
			var lines []string
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				lines = append(lines, strings.Join(strings.Fields(l), " "))
			}
			want := []string{"0", "0", "0 100000 65536", "0 100000 65536", "0:0", "x"}
			if strings.Join(lines, "\n") != strings.Join(want, "\n") {
				t.Errorf("in the user namespace:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
			}
			c.WaitNoShim(t)
		})
	}
}
