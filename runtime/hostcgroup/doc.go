// Package hostcgroup puts a pod's VM on the host's books, as Kata's
// sandbox_cgroup_only does.
//
// With runc, the cgroup that a pod sandbox's (pause) container spec names
// in linux.cgroupsPath holds the pause process, in the pod's cgroup that
// kubelet made. With Cocoon the shim serves the pod alone, so it joins
// that cgroup itself (Join), before it starts anything: the VMM,
// virtiofsd and the network namespace's holder it starts afterwards
// inherit it. kubelet's pod stats (read from the pod's cgroup), containerd's
// (`crictl statsp` reads the pod's cgroup, the sandbox's parent) and the
// pod's own limits then cover the VM's real use. A process started before
// Join stays where it was.
//
// The cgroupsPath is a cgroupfs path or systemd's "slice:prefix:name"
// (see Resolve). Either way this package makes the cgroup through
// cgroupfs: it does not ask systemd for a scope. That is acceptable
// because the pod's slice is kubelet's (kubelet made it through systemd),
// and the scope under it is the shim's alone, at the path systemd would
// have given it, where kubelet and containerd look; systemd knows no unit
// for it (systemctl does not list it) and leaves it alone, as it does the
// cgroups of runc's cgroupfs driver.
//
// On a cgroup v1 host (containerd's cgroups.Mode() is Legacy or Hybrid)
// the cgroup is made in every mounted v1 hierarchy, and in a hybrid host's
// controller-less v2 hierarchy as well, which is where systemd tracks
// processes; the limits go to the memory, cpu and pids hierarchies. On a
// unified (v2) host there is one hierarchy, and the memory, cpu and pids
// controllers are enabled down to the cgroup's parent.
//
// Leave moves the shim back where it was and removes the cgroup, and
// Remove removes one for a process that never joined it (the shim's
// delete after a crash); neither kills anything, and a cgroup that still
// holds a process is left, with an error naming what is inside. Only the
// cgroup itself is removed, never its parents: those are kubelet's (or,
// outside Kubernetes, left as runc leaves them).
package hostcgroup
