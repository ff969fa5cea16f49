package rootfs

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
)

// plan is what Prepare makes of a container's mounts.
type plan struct {
	// lowers are the read-only snapshot directories, lowest first.
	lowers []string
	// upper is the host directory whose content seeds the scratch disk's
	// upperdir (an overlay upperdir); empty when there is none.
	upper string
	// rootFrom is the directory whose root mode, owner and xattrs the
	// scratch upperdir takes when upper is empty.
	rootFrom string
	// readOnly is set when the container gets no writable layer.
	readOnly bool
}

// mountFlags are generic mount options that say how the host would mount
// the tree. The guest mounts the disks itself with its own options, so
// they carry no meaning here.
var mountFlags = []string{
	"rw", "suid", "nosuid", "dev", "nodev", "exec", "noexec",
	"atime", "noatime", "relatime", "norelatime", "strictatime", "nodiratime", "diratime",
	"sync", "async", "dirsync", "lazytime", "nolazytime",
}

// bindFlags are options of a bind mount that do not change what the tree
// holds.
var bindFlags = []string{
	"bind", "rbind",
	"private", "rprivate", "slave", "rslave", "shared", "rshared", "unbindable", "runbindable",
}

// parseMounts checks the mounts containerd gave for a container's root
// and says what to build from them. Unsupported input fails with an error
// naming the mount or option: errdefs.ErrNotImplemented for what is valid
// but not handled, errdefs.ErrInvalidArgument for what is malformed.
func parseMounts(mounts []Mount) (plan, error) {
	switch len(mounts) {
	case 0:
		return plan{}, fmt.Errorf("%w: no rootfs mount (a rootfs directory must be passed as a bind mount)", errdefs.ErrInvalidArgument)
	case 1:
	default:
		return plan{}, fmt.Errorf("%w: %d rootfs mounts (%s); only a single overlay or bind mount is supported",
			errdefs.ErrNotImplemented, len(mounts), describeMounts(mounts))
	}
	m := mounts[0]
	switch m.Type {
	case "overlay":
		return parseOverlay(m)
	case "bind":
		return parseBind(m)
	default:
		return plan{}, fmt.Errorf("%w: rootfs mount type %q (source %q) is not supported; want overlay or bind",
			errdefs.ErrNotImplemented, m.Type, m.Source)
	}
}

func parseOverlay(m Mount) (plan, error) {
	var (
		p         plan
		lowerSeen bool
	)
	for _, o := range m.Options {
		key, val, hasVal := strings.Cut(o, "=")
		switch {
		case key == "lowerdir" && hasVal:
			lowerSeen = true
			dirs, err := splitLowerdir(val)
			if err != nil {
				return plan{}, err
			}
			// The option lists the top-most layer first.
			slices.Reverse(dirs)
			p.lowers = dirs
		case key == "upperdir" && hasVal:
			dir, err := absDir("overlay upperdir", val)
			if err != nil {
				return plan{}, err
			}
			p.upper = dir
		case key == "workdir" && hasVal:
			// The host's workdir is not used: the scratch disk has its
			// own.
		case key == "ro" && !hasVal:
			p.readOnly = true
		case (key == "index" || key == "xino" || key == "nfs_export") && hasVal,
			key == "volatile" && !hasVal:
			// Host-side tuning of an overlay mount that will not be
			// made on the host.
		case (key == "redirect_dir" || key == "metacopy") && val == "off":
			// The default: layers carry no redirects or metacopy files.
		case !hasVal && slices.Contains(mountFlags, key):
		default:
			return plan{}, fmt.Errorf("%w: overlay rootfs option %q is not supported (layers made with it would need the same option in the guest)",
				errdefs.ErrNotImplemented, o)
		}
	}
	if !lowerSeen || len(p.lowers) == 0 {
		return plan{}, fmt.Errorf("%w: overlay rootfs mount has no lowerdir option (options %q)", errdefs.ErrInvalidArgument, m.Options)
	}
	if p.upper == "" {
		// Without an upperdir overlayfs is read-only.
		p.readOnly = true
	}
	if p.readOnly {
		p.upper = ""
	}
	return p, nil
}

func parseBind(m Mount) (plan, error) {
	src, err := absDir("bind rootfs source", m.Source)
	if err != nil {
		return plan{}, err
	}
	p := plan{lowers: []string{src}}
	for _, o := range m.Options {
		switch {
		case o == "ro":
			p.readOnly = true
		case slices.Contains(bindFlags, o), slices.Contains(mountFlags, o):
		default:
			return plan{}, fmt.Errorf("%w: bind rootfs option %q is not supported", errdefs.ErrNotImplemented, o)
		}
	}
	if !p.readOnly {
		// A writable bind mount: the directory becomes a read-only
		// layer under a fresh scratch disk, whose upperdir mirrors the
		// directory's root. CopyBack applies the writes to the
		// directory afterwards (docs/rootfs.md).
		p.rootFrom = src
	}
	return p, nil
}

// splitLowerdir splits an overlay lowerdir value on the colons that are
// not escaped with a backslash.
func splitLowerdir(v string) ([]string, error) {
	var (
		dirs []string
		cur  strings.Builder
	)
	for i := 0; i < len(v); i++ {
		switch {
		case v[i] == '\\' && i+1 < len(v):
			i++
			cur.WriteByte(v[i])
		case v[i] == ':':
			dirs = append(dirs, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(v[i])
		}
	}
	dirs = append(dirs, cur.String())
	for i, d := range dirs {
		abs, err := absDir("overlay lowerdir", d)
		if err != nil {
			return nil, err
		}
		dirs[i] = abs
	}
	return dirs, nil
}

// absDir checks that a path from a mount is absolute and returns it
// cleaned.
func absDir(what, p string) (string, error) {
	if p == "" || !filepath.IsAbs(p) {
		return "", fmt.Errorf("%w: %s %q is not an absolute path", errdefs.ErrInvalidArgument, what, p)
	}
	return filepath.Clean(p), nil
}

func describeMounts(mounts []Mount) string {
	var parts []string
	for _, m := range mounts {
		parts = append(parts, m.Type+" "+m.Source)
	}
	return strings.Join(parts, ", ")
}
