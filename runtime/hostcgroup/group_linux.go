package hostcgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/errdefs"
)

// The cgroup v2 hierarchy's mount points that containerd's cgroups.Mode
// looks at: the only hierarchy on a unified host, the controller-less
// one on a hybrid host.
const (
	unifiedMount = "/sys/fs/cgroup"
	hybridMount  = "/sys/fs/cgroup/unified"
)

// layout is how a host mounts its cgroup hierarchies.
type layout struct {
	// v1 is whether v1 hierarchies carry the controllers (a legacy or a
	// hybrid host).
	v1 bool
	// unified is where the v2 hierarchy is mounted, "" when it is not.
	unified string
}

// hostLayout is this host's layout, as containerd's cgroups.Mode sees it.
func hostLayout() (layout, error) {
	switch cgroups.Mode() {
	case cgroups.Legacy:
		return layout{v1: true}, nil
	case cgroups.Hybrid:
		return layout{v1: true, unified: hybridMount}, nil
	case cgroups.Unified:
		return layout{unified: unifiedMount}, nil
	}
	return layout{}, fmt.Errorf("no cgroup hierarchy is mounted at %s: %w", unifiedMount, errdefs.ErrFailedPrecondition)
}

// hierarchies returns the directories of the cgroup at p in every
// hierarchy of the layout, with the v1 subsystems they are of. With a
// pid, each hierarchy's prev is the directory the process is in; a v1
// hierarchy the process is in none of is left out.
func (lay layout) hierarchies(p string, pid int) ([]hierarchy, []cgroup1.Subsystem, error) {
	var hs []hierarchy
	var subs []cgroup1.Subsystem
	if lay.v1 {
		all, err := cgroup1.Default()
		if err != nil {
			return nil, nil, fmt.Errorf("list the host's cgroup v1 hierarchies: %w", err)
		}
		var at cgroup1.Path
		if pid != 0 {
			at = cgroup1.PidPath(pid)
		}
		for _, s := range all {
			ps, ok := s.(interface{ Path(string) string })
			if !ok {
				continue
			}
			h := hierarchy{name: string(s.Name()), mount: ps.Path("/")}
			if at != nil {
				rel, err := at(s.Name())
				if errors.Is(err, cgroup1.ErrControllerNotActive) {
					continue
				}
				if err != nil {
					return nil, nil, fmt.Errorf("find process %d's cgroup in the %s hierarchy: %w", pid, s.Name(), err)
				}
				h.prev = ps.Path(rel)
			}
			if h.dir, err = under(h.mount, p); err != nil {
				return nil, nil, err
			}
			hs = append(hs, h)
			subs = append(subs, s)
		}
	}
	if lay.unified != "" {
		h := hierarchy{name: "unified", mount: lay.unified}
		if pid != 0 {
			rel, err := cgroup2.PidGroupPath(pid)
			if err != nil {
				return nil, nil, fmt.Errorf("find process %d's cgroup in the unified hierarchy: %w", pid, err)
			}
			h.prev = filepath.Join(lay.unified, rel)
		}
		var err error
		if h.dir, err = under(h.mount, p); err != nil {
			return nil, nil, err
		}
		hs = append(hs, h)
	}
	return hs, subs, nil
}

// limiter writes a group's limits in one cgroup version's files.
type limiter interface {
	// apply writes l, every field of it, and returns the limits in force:
	// v1 lowers a CPU quota above an ancestor's, which its kernel refuses.
	apply(l Limits) (Limits, error)
	// memoryUsage is the memory charged to the group, in bytes; 0 when
	// the host has no memory controller.
	memoryUsage() (int64, error)
}

// groupState is where a Group is in its life.
type groupState int

const (
	// joined: the process is in the group.
	joined groupState = iota
	// movedBack: Leave moved the process back but could not remove the
	// group; Leave again tries again.
	movedBack
	// removed: Leave moved the process back and removed the group.
	removed
)

// Group is a host cgroup that a process joined.
type Group struct {
	// path is the group's path from each hierarchy's root.
	path string
	// pid is the process Join moved in, which Leave moves back.
	pid int
	// hierarchies are the group's directories, one a hierarchy, each
	// with where the process was before.
	hierarchies []hierarchy
	// limiter writes the limits.
	limiter limiter

	// mu guards limits and state, and makes Update and Leave one at a
	// time.
	mu sync.Mutex
	// limits are the limits in force.
	limits Limits
	state  groupState
}

// Join makes the cgroup that cgroupsPath (an OCI spec's
// linux.cgroupsPath, see Resolve) names, in every hierarchy, writes the
// limits to it and moves the calling process, all its threads, into it.
// What the process starts afterwards is in the group too.
//
// A cgroup that exists already is used if it holds no process (one left
// by a shim that crashed), and refused with ErrAlreadyExists if it does.
// A memory limit below what the process and the group already use is
// refused with ErrFailedPrecondition, and a limit the host has no
// controller for too. If Join fails, the process stays where it was and
// what Join made is removed.
func Join(cgroupsPath string, limits Limits) (*Group, error) {
	p, err := Resolve(cgroupsPath)
	if err != nil {
		return nil, err
	}
	lay, err := hostLayout()
	if err != nil {
		return nil, err
	}
	return join(p, limits, os.Getpid(), lay)
}

// join is Join of the process pid into the cgroup at p, a Resolve result,
// in the hierarchies of lay.
func join(p string, l Limits, pid int, lay layout) (_ *Group, retErr error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	hs, subs, err := lay.hierarchies(p, pid)
	if err != nil {
		return nil, err
	}
	if len(hs) == 0 {
		return nil, fmt.Errorf("process %d is in no cgroup hierarchy of this host: %w", pid, errdefs.ErrFailedPrecondition)
	}
	for i := range hs {
		if hs[i].created, err = missing(hs[i].dir, hs[i].mount); err != nil {
			return nil, fmt.Errorf("cgroup %s (%s hierarchy): %w", p, hs[i].name, err)
		}
		if len(hs[i].created) > 0 {
			continue
		}
		if pids, err := procs(hs[i].dir); err != nil {
			return nil, fmt.Errorf("cgroup %s (%s hierarchy): %w", p, hs[i].name, err)
		} else if len(pids) > 0 {
			return nil, fmt.Errorf("cgroup %s already holds processes %s (%s): %w", p, describe(pids), inHierarchies([]string{hs[i].name}), errdefs.ErrAlreadyExists)
		}
	}
	resident, err := rss(pid)
	if err != nil {
		return nil, fmt.Errorf("read the memory process %d uses: %w", pid, err)
	}
	defer func() {
		if retErr != nil {
			undo(hs)
		}
	}()
	var lim limiter
	if lay.v1 {
		if lim, err = newV1(p, hs, subs); err != nil {
			return nil, err
		}
	}
	if lay.unified != "" {
		m, err := cgroup2.NewManager(lay.unified, p, &cgroup2.Resources{})
		if err != nil {
			return nil, fmt.Errorf("make cgroup %s (unified hierarchy): %w", p, err)
		}
		if !lay.v1 {
			if lim, err = newV2(p, lay.unified, m); err != nil {
				return nil, err
			}
		}
	}
	used, err := lim.memoryUsage()
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", p, err)
	}
	if err := checkMemory(p, l, resident+used, fmt.Sprintf("process %d and the group use", pid)); err != nil {
		return nil, err
	}
	inForce, err := lim.apply(l)
	if err != nil {
		return nil, fmt.Errorf("set the limits of cgroup %s: %w", p, err)
	}
	if err := move(hs, pid, true); err != nil {
		return nil, err
	}
	return &Group{path: p, pid: pid, hierarchies: hs, limiter: lim, limits: inForce}, nil
}

// checkMemory refuses a memory limit below used bytes, which the kernel
// would meet by reclaiming what it can and then refusing (v1) or killing
// (v2); who says who uses them.
func checkMemory(p string, l Limits, used int64, who string) error {
	if l.MemoryBytes > 0 && l.MemoryBytes < used {
		return fmt.Errorf("memory limit of cgroup %s, %d bytes (%d MiB), is below the %d bytes (%d MiB) %s already: %w",
			p, l.MemoryBytes, l.MemoryBytes>>20, used, used>>20, who, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Path is the group's cgroupfs path from each hierarchy's root, where
// kubelet and containerd find it: /kubepods/besteffort/pod<uid>/<id>, or
// a systemd scope's path.
func (g *Group) Path() string { return g.path }

// Limits are the limits in force: those last given, but on cgroup v1 a
// CPU quota lowered to the one of the nearest ancestor that has a lower
// one (the pod's), which v1 kernels require.
func (g *Group) Limits() Limits {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limits
}

// Update writes new limits to the group, every field (a zero lifts a
// cap), as for a pod's UpdateContainerResources. A memory limit below
// what the group uses already is refused with ErrFailedPrecondition, and
// so is an Update after Leave.
func (g *Group) Update(l Limits) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != joined {
		return fmt.Errorf("update cgroup %s: the process left it: %w", g.path, errdefs.ErrFailedPrecondition)
	}
	if err := l.validate(); err != nil {
		return err
	}
	used, err := g.limiter.memoryUsage()
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", g.path, err)
	}
	if err := checkMemory(g.path, l, used, "the group uses"); err != nil {
		return err
	}
	inForce, err := g.limiter.apply(l)
	if err != nil {
		return fmt.Errorf("set the limits of cgroup %s: %w", g.path, err)
	}
	g.limits = inForce
	return nil
}

// Leave moves the process back to the cgroups it was in before Join (to
// the nearest ancestor of one that is gone since) and removes the group
// from every hierarchy. It kills nothing: a group that
// still holds a process (a VMM not yet gone) is left, with an
// ErrFailedPrecondition naming what it holds, and Leave may be called
// again to remove it once that has ended. Leave after the group was
// removed is an ErrFailedPrecondition.
func (g *Group) Leave() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.state {
	case removed:
		return fmt.Errorf("leave cgroup %s: left and removed already: %w", g.path, errdefs.ErrFailedPrecondition)
	case joined:
		if err := move(g.hierarchies, g.pid, false); err != nil {
			return err
		}
		g.state = movedBack
	}
	if err := remove(g.path, g.hierarchies); err != nil {
		return err
	}
	g.state = removed
	return nil
}

// Remove removes the cgroup that cgroupsPath names from every hierarchy,
// for a process that did not join it: the shim's delete, after the shim
// that joined it is gone. It kills nothing: a cgroup that still holds a
// process or a child cgroup is left, with an ErrFailedPrecondition that
// names them. A cgroup that does not exist is no error.
func Remove(cgroupsPath string) error {
	p, err := Resolve(cgroupsPath)
	if err != nil {
		return err
	}
	lay, err := hostLayout()
	if err != nil {
		return err
	}
	hs, _, err := lay.hierarchies(p, 0)
	if err != nil {
		return err
	}
	return remove(p, hs)
}
