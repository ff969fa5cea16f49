package oci

import (
	"path"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/guest/api"
)

// Bind is a bind mount of a host path in a container's spec. It reaches
// the guest through the sandbox's share: the host binds Source under the
// share's directory, and the guest's spec binds the share's copy.
type Bind struct {
	// Index is the mount's position in the spec's mounts, which names it
	// in the share.
	Index int
	// Source is the host path, absolute and clean; Destination the path
	// in the container.
	Source      string
	Destination string
	// ReadOnly: the host makes the share's copy read-only, so that the
	// guest cannot write it whatever it mounts.
	ReadOnly bool
	// Recursive: the mounts below Source come too (rbind).
	Recursive bool
}

// isBind reports whether m is a bind mount, by type or by option.
func isBind(m specs.Mount) bool {
	return m.Type == "bind" || m.Type == "rbind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// Binds lists the bind mounts of spec that come from the host, in order:
// all but /dev/shm's, which the guest serves itself. A relative source is
// refused by GuestSpec, and left out here.
func Binds(spec *specs.Spec) []Bind {
	if spec == nil {
		return nil
	}
	var out []Bind
	for i, m := range spec.Mounts {
		if !isBind(m) || isShmBind(m) || !filepath.IsAbs(m.Source) {
			continue
		}
		out = append(out, Bind{
			Index:       i,
			Source:      filepath.Clean(m.Source),
			Destination: m.Destination,
			ReadOnly:    readOnly(m.Options),
			Recursive:   m.Type == "rbind" || slices.Contains(m.Options, "rbind"),
		})
	}
	return out
}

// readOnly reports whether mount options end read-only: the last of ro
// and rw wins, as in mount(8).
func readOnly(options []string) bool {
	ro := false
	for _, o := range options {
		switch o {
		case "ro":
			ro = true
		case "rw":
			ro = false
		}
	}
	return ro
}

// BindGuestPath is where bind mount index of container id is in the
// guest's copy of the share: <api.ShareRoot>/<container id>/<index>.
func BindGuestPath(containerID string, index int) string {
	return path.Join(api.ShareRoot, containerID, strconv.Itoa(index))
}

// translateBinds points each bind mount of g at the share's copy of its
// source in the guest. A source must be an absolute host path.
func translateBinds(g *specs.Spec, containerID string, fail failFunc) {
	for i, m := range g.Mounts {
		if !isBind(m) || m.Source == api.ShmDir && isShmBind(m) {
			continue
		}
		if !filepath.IsAbs(m.Source) {
			fail(errdefs.ErrInvalidArgument, "mount %s: the bind mount's source %q is not an absolute host path", m.Destination, m.Source)
			continue
		}
		g.Mounts[i].Source = BindGuestPath(containerID, i)
		if m.Type != "bind" && m.Type != "rbind" {
			g.Mounts[i].Type = "bind"
		}
	}
}

// HasHostHooks reports whether h has hooks that run in the runtime's
// namespace, which Cocoon runs on the host.
func HasHostHooks(h *specs.Hooks) bool {
	return h != nil && (len(h.Prestart) > 0 || len(h.CreateRuntime) > 0 || len(h.CreateContainer) > 0 || //nolint:staticcheck // prestart: deprecated, still written by Docker
		len(h.Poststart) > 0 || len(h.Poststop) > 0)
}

// dropHostHooks removes the hooks that run on the host from the guest's
// spec, keeping startContainer, which runs in the container.
func dropHostHooks(g *specs.Spec) {
	if g.Hooks == nil {
		return
	}
	g.Hooks = &specs.Hooks{StartContainer: g.Hooks.StartContainer}
	if len(g.Hooks.StartContainer) == 0 {
		g.Hooks = nil
	}
}
