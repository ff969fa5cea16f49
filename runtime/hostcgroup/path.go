package hostcgroup

import (
	"fmt"
	"path"
	"strings"

	"github.com/containerd/errdefs"
)

const (
	// maxPathLen bounds a resolved path (PATH_MAX); a name of a
	// directory is bounded by nameMax (NAME_MAX).
	maxPathLen = 4096
	nameMax    = 255
	// defaultSlice is where runc's systemd driver puts a unit whose
	// cgroupsPath names no slice.
	defaultSlice = "system.slice"
)

// Resolve returns the path, from the root of every cgroup hierarchy,
// of the cgroup that an OCI spec's linux.cgroupsPath names.
//
// Two forms are understood, told apart by their shape as the spec's
// author (kubelet's cgroup driver, through containerd) wrote them:
//
//   - systemd's "slice:prefix:name", which has exactly two colons and no
//     slash: the slice is expanded as systemd does (runc's systemd driver
//     does the same), each dash a level down, and the unit is the scope
//     "prefix-name.scope" in it, or name itself when name is a slice.
//     "kubepods-besteffort-pod1.slice:cri-containerd:abc" is
//     /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope.
//     An empty slice is system.slice, as with runc.
//   - anything else is a cgroupfs path. A relative one is taken from the
//     root too: runc nests it under its own cgroup, but the shim's own
//     cgroup is containerd's (and the delete process's may be another),
//     while containerd reads a pod's cgroup from the root.
//
// The path is cleaned; one with a ".." component, a control character,
// an over-long name, or one that is the root itself is refused with
// ErrInvalidArgument: whatever wrote it, the shim must not put itself
// (or remove) anything but a cgroup of its own below the root.
func Resolve(cgroupsPath string) (string, error) {
	if cgroupsPath == "" {
		return "", fmt.Errorf("empty cgroupsPath: %w", errdefs.ErrInvalidArgument)
	}
	for _, r := range cgroupsPath {
		if r < 0x20 || r == 0x7f {
			return "", fmt.Errorf("cgroupsPath %q: a control character: %w", cgroupsPath, errdefs.ErrInvalidArgument)
		}
	}
	var p string
	if !strings.Contains(cgroupsPath, "/") && strings.Contains(cgroupsPath, ":") {
		parts := strings.Split(cgroupsPath, ":")
		if len(parts) != 3 {
			return "", fmt.Errorf("cgroupsPath %q: neither a cgroupfs path nor systemd's \"slice:prefix:name\": %w", cgroupsPath, errdefs.ErrInvalidArgument)
		}
		var err error
		if p, err = systemdPath(parts[0], parts[1], parts[2]); err != nil {
			return "", fmt.Errorf("cgroupsPath %q: %w", cgroupsPath, err)
		}
	} else {
		for _, c := range strings.Split(cgroupsPath, "/") {
			if c == ".." {
				return "", fmt.Errorf("cgroupsPath %q: a \"..\" component: %w", cgroupsPath, errdefs.ErrInvalidArgument)
			}
		}
		p = path.Clean("/" + cgroupsPath)
	}
	if p == "/" {
		return "", fmt.Errorf("cgroupsPath %q is the root cgroup: %w", cgroupsPath, errdefs.ErrInvalidArgument)
	}
	if len(p) > maxPathLen {
		return "", fmt.Errorf("cgroupsPath %q: longer than %d bytes: %w", cgroupsPath, maxPathLen, errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(p[1:], "/") {
		if len(c) > nameMax {
			return "", fmt.Errorf("cgroupsPath %q: a name longer than %d bytes: %w", cgroupsPath, nameMax, errdefs.ErrInvalidArgument)
		}
	}
	return p, nil
}

// systemdPath is the cgroupfs path of the unit that systemd's
// "slice:prefix:name" names, as runc's systemd driver computes it
// (without its offset for a pid 1 that is not in the root cgroup).
func systemdPath(slice, prefix, name string) (string, error) {
	if slice == "" {
		slice = defaultSlice
	}
	dir, err := ExpandSlice(slice)
	if err != nil {
		return "", err
	}
	if name == "" {
		return "", fmt.Errorf("systemd form with no unit name: %w", errdefs.ErrInvalidArgument)
	}
	for _, s := range []string{prefix, name} {
		if s == "." || s == ".." {
			return "", fmt.Errorf("unit prefix or name %q: %w", s, errdefs.ErrInvalidArgument)
		}
	}
	unit := name
	if !strings.HasSuffix(name, ".slice") {
		unit = prefix + "-" + name + ".scope"
	} else if name == "-.slice" {
		return "", fmt.Errorf("unit name %q is the root slice: %w", name, errdefs.ErrInvalidArgument)
	} else if _, err := ExpandSlice(name); err != nil {
		return "", err
	}
	return path.Join(dir, unit), nil
}

// ExpandSlice returns the cgroupfs path of a systemd slice: each
// dash-separated component of its name is a level of slices, so
// "kubepods-besteffort-pod1.slice" is
// /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice,
// and "-.slice" is the root. It refuses a name systemd would: one that
// does not end in ".slice", holds a slash, or has an empty component
// ("a--b.slice", "-a.slice").
func ExpandSlice(slice string) (string, error) {
	const suffix = ".slice"
	if !strings.HasSuffix(slice, suffix) || len(slice) == len(suffix) || strings.Contains(slice, "/") {
		return "", fmt.Errorf("invalid slice name %q: %w", slice, errdefs.ErrInvalidArgument)
	}
	base := strings.TrimSuffix(slice, suffix)
	if base == "-" {
		return "/", nil
	}
	var b strings.Builder
	var prefix string
	for _, c := range strings.Split(base, "-") {
		if c == "" {
			return "", fmt.Errorf("invalid slice name %q: an empty component: %w", slice, errdefs.ErrInvalidArgument)
		}
		b.WriteString("/" + prefix + c + suffix)
		prefix += c + "-"
	}
	return b.String(), nil
}
