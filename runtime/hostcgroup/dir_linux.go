package hostcgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// hierarchy is one cgroup hierarchy a group is in.
type hierarchy struct {
	// name names the hierarchy in errors: its v1 controller ("memory",
	// "systemd" for name=systemd) or "unified".
	name string
	// mount is where the hierarchy is mounted: the group's directory and
	// prev are below it.
	mount string
	// dir is the group's directory.
	dir string
	// prev is the directory the joined process was in before, to which
	// Leave moves it back; empty for Remove's hierarchies.
	prev string
	// created are the directories that Join made, the group's own first
	// and its parents after it, which a failed Join removes again.
	created []string
}

// under returns the directory of the cgroup at path p (a Resolve result)
// in the hierarchy mounted at mount, refusing one that is not below it.
func under(mount, p string) (string, error) {
	dir := filepath.Join(mount, p)
	if rel, err := filepath.Rel(mount, dir); err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("cgroup %s is not below the hierarchy at %s: %w", p, mount, errdefs.ErrInvalidArgument)
	}
	return dir, nil
}

// missing returns the directories from dir up to (but not including)
// the first that exists, dir first: what making dir will create.
func missing(dir, mount string) ([]string, error) {
	var out []string
	for d := dir; d != mount && len(d) > len(mount); d = filepath.Dir(d) {
		_, err := os.Lstat(d)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// undo removes the directories the hierarchies' Join made, for a Join
// that failed; it is best effort, as the error being returned says more.
func undo(hs []hierarchy) {
	for _, h := range hs {
		for _, d := range h.created {
			if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
				break
			}
		}
	}
}

// writeProcs moves the process pid (all its threads) into the cgroup at
// dir. It retries on EINVAL, which the kernel returns for a task that is
// still being forked, as runc and containerd's cgroups do.
func writeProcs(dir string, pid int) error {
	f, err := os.OpenFile(filepath.Join(dir, "cgroup.procs"), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	b := []byte(strconv.Itoa(pid))
	for range 5 {
		if _, err = f.Write(b); !errors.Is(err, unix.EINVAL) {
			break
		}
		time.Sleep(30 * time.Millisecond)
	}
	return err
}

// move moves pid into each hierarchy's dir (to is true) or back to its
// prev, or, if prev is gone since, to prev's nearest ancestor. A failure
// moves it back where it was in the hierarchies it was already moved in,
// so that it is never left split between the two.
func move(hs []hierarchy, pid int, to bool) error {
	for i, h := range hs {
		dst, src := h.dir, h.prev
		if !to {
			dst, src = nearest(src, h.mount), dst
		}
		if err := writeProcs(dst, pid); err != nil {
			for _, done := range hs[:i] {
				back := done.prev
				if !to {
					back = done.dir
				}
				_ = writeProcs(back, pid)
			}
			return fmt.Errorf("move process %d from %s to %s (%s hierarchy): %w", pid, src, dst, h.name, err)
		}
	}
	return nil
}

// nearest is dir, or if it is gone its nearest ancestor, up to mount.
func nearest(dir, mount string) string {
	for ; len(dir) > len(mount); dir = filepath.Dir(dir) {
		if _, err := os.Lstat(dir); err == nil {
			break
		}
	}
	return dir
}

// procs returns the pids of the processes in the cgroup at dir (not in
// its children).
func procs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		if pid, err := strconv.Atoi(strings.TrimSpace(s.Text())); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// children returns the names of the child cgroups of the cgroup at dir.
func children(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// describe names the processes pids as ps would: "123 (qemu-system-x86)".
func describe(pids []int) string {
	s := make([]string, len(pids))
	for i, pid := range pids {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			s[i] = strconv.Itoa(pid)
			continue
		}
		s[i] = fmt.Sprintf("%d (%s)", pid, strings.TrimSpace(string(comm)))
	}
	return strings.Join(s, ", ")
}

// contents says what a cgroup holds in its directories of hs, "" when
// it holds nothing in any: processes and child cgroups, each named once,
// and the hierarchies they are in.
func contents(hs []hierarchy) string {
	var pids []int
	var kids, where []string
	for _, h := range hs {
		p, _ := procs(h.dir)
		k, _ := children(h.dir)
		if len(p) == 0 && len(k) == 0 {
			continue
		}
		where = append(where, h.name)
		for _, pid := range p {
			if !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
		for _, c := range k {
			if !slices.Contains(kids, c) {
				kids = append(kids, c)
			}
		}
	}
	if len(where) == 0 {
		return ""
	}
	var parts []string
	if len(pids) > 0 {
		slices.Sort(pids)
		parts = append(parts, "processes "+describe(pids))
	}
	if len(kids) > 0 {
		slices.Sort(kids)
		parts = append(parts, "child cgroups "+strings.Join(kids, ", "))
	}
	return fmt.Sprintf("%s (%s)", strings.Join(parts, " and "), inHierarchies(where))
}

// inHierarchies says "in the memory hierarchy", or "in the cpu, memory
// hierarchies".
func inHierarchies(names []string) string {
	if len(names) == 1 {
		return "in the " + names[0] + " hierarchy"
	}
	return "in the " + strings.Join(names, ", ") + " hierarchies"
}

// remove removes the cgroup at path from every hierarchy hs: a directory
// already gone is no error, and one that still holds a process or a child
// cgroup is left, with an ErrFailedPrecondition that names them. It kills
// nothing. It retries a little while a directory that looks empty is
// busy: a task that has just exited can hold it for a moment.
func remove(path string, hs []hierarchy) error {
	var busy []hierarchy
	var errs []error
	for _, h := range hs {
		err := unix.Rmdir(h.dir)
		for delay := 10 * time.Millisecond; errors.Is(err, unix.EBUSY) && delay <= 160*time.Millisecond; delay *= 2 {
			if contents([]hierarchy{h}) != "" {
				break
			}
			time.Sleep(delay)
			err = unix.Rmdir(h.dir)
		}
		switch {
		case err == nil, errors.Is(err, unix.ENOENT):
		case errors.Is(err, unix.EBUSY):
			busy = append(busy, h)
		default:
			errs = append(errs, fmt.Errorf("remove cgroup %s (%s hierarchy): %w", path, h.name, err))
		}
	}
	if len(busy) > 0 {
		what := contents(busy)
		if what == "" {
			what = "nothing it lists, yet the kernel says it is busy (" + inHierarchies(names(busy)) + ")"
		}
		errs = append(errs, fmt.Errorf("cgroup %s is not empty, so not removed: it holds %s: %w", path, what, errdefs.ErrFailedPrecondition))
	}
	return errors.Join(errs...)
}

// names are the hierarchies' names.
func names(hs []hierarchy) []string {
	s := make([]string, len(hs))
	for i, h := range hs {
		s[i] = h.name
	}
	return s
}

// readInt reads a cgroup file holding one integer ("max" is -1).
func readInt(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number: %w", file, s, err)
	}
	return v, nil
}

// rss is the memory the process pid has resident, in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/statm: %q: %w", pid, b, errdefs.ErrUnknown)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/statm: %w", pid, err)
	}
	return pages * int64(os.Getpagesize()), nil
}
