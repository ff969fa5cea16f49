package rootfs

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Policy says what a container's writes may put into the host's
// directories when they come back: what the same container could have
// written there under runc, whose containers write into the upperdir
// directly. PolicyFor derives it from the container's OCI spec.
type Policy struct {
	// Mknod allows device nodes other than whiteouts: CAP_MKNOD, and no
	// user namespace (whose root cannot make device nodes).
	Mknod bool
	// SetFcap allows file capabilities (security.capability): CAP_SETFCAP.
	SetFcap bool
	// AnySetuid allows the set-user-ID bit on a file of any owner:
	// CAP_FOWNER or CAP_SETUID. Without it only files owned by UID keep
	// the bit.
	AnySetuid bool
	// AnySetgid allows the set-group-ID bit on a file of any group:
	// CAP_FSETID or CAP_SETGID. Without it only files of one of GIDs
	// keep the bit.
	AnySetgid bool
	// UID and GIDs are the container's user and groups (its process's
	// user, additional groups included) as the host sees them: mapped
	// through the user namespace, if any. HasUID is false when the user
	// is outside the mapping.
	UID    uint32
	HasUID bool
	GIDs   []uint32
	// UserNS is set when the container has a user namespace: every file
	// must then be owned by ids inside UIDMap and GIDMap (host ids).
	UserNS         bool
	UIDMap, GIDMap []IDRange
}

// IDRange is a range of host ids, [Start, Start+Size).
type IDRange struct {
	Start, Size uint32
}

func (r IDRange) contains(id uint32) bool {
	return id >= r.Start && uint64(id) < uint64(r.Start)+uint64(r.Size)
}

// inRanges reports whether id is in one of ranges.
func inRanges(ranges []IDRange, id uint32) bool {
	return slices.ContainsFunc(ranges, func(r IDRange) bool { return r.contains(id) })
}

// PolicyFor is the policy of a container whose OCI spec (the host's
// view, as containerd wrote it) is spec. Its capabilities are every
// capability in any of its init process's sets: what any process of the
// container can come to hold. An exec given more does not widen it. A nil
// spec, or one without capabilities, allows nothing privileged.
func PolicyFor(spec *specs.Spec) Policy {
	var p Policy
	caps := map[string]bool{}
	var user specs.User
	if spec != nil && spec.Process != nil {
		user = spec.Process.User
		if c := spec.Process.Capabilities; c != nil {
			for _, set := range [][]string{c.Bounding, c.Effective, c.Permitted, c.Inheritable, c.Ambient} {
				for _, name := range set {
					caps[name] = true
				}
			}
		}
	}
	var uidMaps, gidMaps []specs.LinuxIDMapping
	if spec != nil && spec.Linux != nil {
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type == specs.UserNamespace {
				p.UserNS = true
			}
		}
		uidMaps, gidMaps = spec.Linux.UIDMappings, spec.Linux.GIDMappings
	}
	p.Mknod = caps["CAP_MKNOD"] && !p.UserNS
	p.SetFcap = caps["CAP_SETFCAP"]
	p.AnySetuid = caps["CAP_FOWNER"] || caps["CAP_SETUID"]
	p.AnySetgid = caps["CAP_FSETID"] || caps["CAP_SETGID"]
	if !p.UserNS {
		p.UID, p.HasUID = user.UID, true
		p.GIDs = append([]uint32{user.GID}, user.AdditionalGids...)
		return p
	}
	for _, m := range uidMaps {
		p.UIDMap = append(p.UIDMap, IDRange{Start: m.HostID, Size: m.Size})
	}
	for _, m := range gidMaps {
		p.GIDMap = append(p.GIDMap, IDRange{Start: m.HostID, Size: m.Size})
	}
	p.UID, p.HasUID = hostID(uidMaps, user.UID)
	for _, g := range append([]uint32{user.GID}, user.AdditionalGids...) {
		if h, ok := hostID(gidMaps, g); ok {
			p.GIDs = append(p.GIDs, h)
		}
	}
	return p
}

// hostID maps a container id to the host's through maps.
func hostID(maps []specs.LinuxIDMapping, id uint32) (uint32, bool) {
	for _, m := range maps {
		if id >= m.ContainerID && uint64(id) < uint64(m.ContainerID)+uint64(m.Size) {
			return m.HostID + (id - m.ContainerID), true
		}
	}
	return 0, false
}
