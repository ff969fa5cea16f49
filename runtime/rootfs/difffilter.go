package rootfs

import (
	"archive/tar"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"path"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
)

// Names of the OCI image-layer format's whiteouts and of tar's extended
// attribute records.
const (
	whiteoutPrefix     = ".wh."
	whiteoutMetaPrefix = ".wh..wh."
	whiteoutOpaque     = ".wh..wh..opq"
	paxXattr           = "SCHILY.xattr."
)

// Why an entry of a diff is left out (refused) or applied without some of
// its attributes (stripped): what a copy back reports.
const (
	refusedName      = "name leaves the target"
	refusedLongName  = "name too long"
	refusedSymlink   = "written through a symlink of the diff"
	refusedNotDir    = "parent is not a directory of the diff"
	refusedRoot      = "root is not a directory"
	refusedOpaque    = "opaque root directory"
	refusedWhiteout  = "malformed whiteout"
	refusedType      = "unsupported entry type"
	refusedLink      = "hard link to no earlier file of the diff"
	refusedDevice    = "device node without CAP_MKNOD"
	refusedDeviceNS  = "device node in a user namespace"
	refusedIDRange   = "owner id out of range"
	refusedOwner     = "owner outside the user namespace's mapping"
	strippedSetuid   = "set-user-ID bit without CAP_FOWNER or CAP_SETUID"
	strippedSetgid   = "set-group-ID bit without CAP_FSETID or CAP_SETGID"
	strippedFcaps    = "security.capability without CAP_SETFCAP"
	strippedTrusted  = "trusted.* attribute"
	strippedSecurity = "security.* attribute"
	strippedACL      = "ACL naming an id outside the mapping"
	strippedXattr    = "attribute of an unknown namespace"
)

// Bounds of one diff.
const (
	// maxDiffEntries bounds the entries of a diff: three times the inodes
	// of a full default scratch disk (mkfs.ext4 makes one per 16 KiB).
	// containerd's archive keeps every name it applied, so this bounds
	// the memory a copy back takes too.
	maxDiffEntries = 2 << 20
	// maxPath and maxName are Linux's PATH_MAX and NAME_MAX.
	maxPath = 4096
	maxName = 255
	// maxExamples is how many refused or stripped entries a report names.
	maxExamples = 10
	// maxRefusedDevices bounds the refused device entries remembered for
	// the links that name them; links to others are refused.
	maxRefusedDevices = 4096
)

// CopyBackReport says what one copy back did.
type CopyBackReport struct {
	// Changed is whether the guest said the layer had changed; without
	// a change nothing was read or applied.
	Changed bool
	// Bytes is the size of the diff and Entries its number of entries.
	Bytes   int64
	Entries int
	// Refused counts the entries left out, by reason; Stripped the
	// attributes taken off entries that were applied, by reason.
	Refused, Stripped map[string]int
	// Examples are the first entries refused or stripped, as
	// "name: reason".
	Examples []string
}

// Denied is how many entries were refused or stripped.
func (r *CopyBackReport) Denied() int {
	n := 0
	for _, c := range r.Refused {
		n += c
	}
	for _, c := range r.Stripped {
		n += c
	}
	return n
}

func (r *CopyBackReport) note(counts *map[string]int, name, reason string) {
	if *counts == nil {
		*counts = map[string]int{}
	}
	(*counts)[reason]++
	if len(r.Examples) < maxExamples {
		r.Examples = append(r.Examples, fmt.Sprintf("%q: %s", name, reason))
	}
}

// entryKind is what a non-directory entry of a diff made.
type entryKind uint8

const (
	kindFile entryKind = iota + 1 // regular file, FIFO, or a hard link to one
	kindSymlink
	kindDevice
	kindWhiteout
)

// diffFilter applies a Policy to the entries of one diff, as
// containerd's archive.Apply calls its filter: before each entry is
// written, with the entry's name cleaned. It refuses what the container
// could not have written under runc, takes off the attributes it could
// not have set, and counts both. It keeps, by a hash of their names, the
// non-directory entries so far: hard links must name one, and nothing
// may be written below one (a name that goes through a symlink of the
// diff is never what a real tree holds).
type diffFilter struct {
	p      Policy
	prior  *priorTree
	report *CopyBackReport
	seed   maphash.Seed
	names  map[uint64]entryKind
	// devices are the device numbers of the device entries, for links.
	devices map[uint64]uint64
	// refusedDevices are the device entries refused (at most
	// maxRefusedDevices), for the hard links that name them: the guest
	// writes an inode's first name whole, its other names as links.
	refusedDevices map[uint64]deviceNode
	// root is the diff's root entry, which archive does not apply: the
	// attributes of the container's root directory.
	root *tar.Header
}

func newDiffFilter(p Policy, prior *priorTree, report *CopyBackReport) *diffFilter {
	return &diffFilter{p: p, prior: prior, report: report, seed: maphash.MakeSeed(),
		names: map[uint64]entryKind{}, devices: map[uint64]uint64{}, refusedDevices: map[uint64]deviceNode{}}
}

// deviceNode is a device entry's type and number.
type deviceNode struct {
	typ          byte
	major, minor uint32
}

// rememberDevice notes a refused device entry for links to it.
func (f *diffFilter) rememberDevice(hdr *tar.Header, name string) {
	if len(f.refusedDevices) < maxRefusedDevices {
		f.refusedDevices[f.hash(name)] = deviceNode{typ: hdr.Typeflag, major: uint32(hdr.Devmajor), minor: uint32(hdr.Devminor)}
	}
}

func (f *diffFilter) hash(name string) uint64 { return maphash.String(f.seed, name) }

// refuse leaves an entry out.
func (f *diffFilter) refuse(name, reason string) (bool, error) {
	f.report.note(&f.report.Refused, name, reason)
	return false, nil
}

// accept is the archive.Filter.
func (f *diffFilter) accept(hdr *tar.Header) (bool, error) {
	f.report.Entries++
	if f.report.Entries > maxDiffEntries {
		return false, fmt.Errorf("the diff holds more than %d entries: %w", maxDiffEntries, errdefs.ErrResourceExhausted)
	}
	hdr.Xattrs = nil //nolint:staticcheck // archive reads PAXRecords; this is their old copy
	name := hdr.Name
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return f.refuse(name, refusedRoot)
		}
		if reason := f.vetOwner(hdr, name); reason != "" {
			return f.refuse(name, reason)
		}
		f.vetAttrs(hdr, name)
		f.root = hdr
		return false, nil
	}
	if reason := checkName(name); reason != "" {
		return f.refuse(name, reason)
	}
	if reason := f.checkParents(name); reason != "" {
		return f.refuse(name, reason)
	}
	if base := path.Base(name); strings.HasPrefix(base, whiteoutPrefix) {
		return f.whiteout(hdr, name, base)
	}
	return f.judge(hdr, name)
}

// judge checks an entry by its type, owner and attributes.
func (f *diffFilter) judge(hdr *tar.Header, name string) (bool, error) {
	kind := entryKind(0)
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeRegA, tar.TypeFifo: //nolint:staticcheck // TypeRegA is still read
		kind = kindFile
	case tar.TypeDir:
	case tar.TypeSymlink:
		kind = kindSymlink
	case tar.TypeLink:
		target := path.Clean(hdr.Linkname)
		if checkName(target) != "" {
			return f.refuse(name, refusedName)
		}
		if dev, ok := f.refusedDevices[f.hash(target)]; ok {
			// The device node's first name was refused: this name is
			// judged as the same node made at its own path (a copy-up
			// of the image's keeps it there).
			hdr.Typeflag, hdr.Linkname, hdr.Devmajor, hdr.Devminor = dev.typ, "", int64(dev.major), int64(dev.minor)
			return f.judge(hdr, name)
		}
		k, ok := f.names[f.hash(target)]
		if !ok || k == kindWhiteout {
			return f.refuse(name, refusedLink)
		}
		if k == kindDevice && !f.p.Mknod {
			// A new name for a device node is a new device node.
			major, minor := splitDev(f.devices[f.hash(target)])
			if !f.prior.sameDevice(name, tar.TypeChar, major, minor) && !f.prior.sameDevice(name, tar.TypeBlock, major, minor) {
				return f.refuse(name, f.deviceReason())
			}
		}
		hdr.Linkname, kind = target, k
	case tar.TypeChar, tar.TypeBlock:
		if hdr.Devmajor < 0 || hdr.Devmajor > math.MaxUint32 || hdr.Devminor < 0 || hdr.Devminor > math.MaxUint32 {
			return f.refuse(name, refusedType)
		}
		if !f.p.Mknod && !f.prior.sameDevice(name, hdr.Typeflag, uint32(hdr.Devmajor), uint32(hdr.Devminor)) {
			f.rememberDevice(hdr, name)
			return f.refuse(name, f.deviceReason())
		}
		kind = kindDevice
		f.devices[f.hash(name)] = joinDev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	default:
		return f.refuse(name, refusedType)
	}
	// A hard link entry's owner, mode and attributes go onto the inode it
	// links to: they are vetted as any file's.
	if reason := f.vetOwner(hdr, name); reason != "" {
		if kind == kindDevice {
			f.rememberDevice(hdr, name)
		}
		return f.refuse(name, reason)
	}
	f.vetAttrs(hdr, name)
	if kind == 0 {
		delete(f.names, f.hash(name)) // a directory over an earlier entry
	} else {
		f.names[f.hash(name)] = kind
	}
	return true, nil
}

func (f *diffFilter) deviceReason() string {
	if f.p.UserNS {
		return refusedDeviceNS
	}
	return refusedDevice
}

// checkName says why name, cleaned, cannot be written below the target,
// or "".
func checkName(name string) string {
	switch {
	case name == "" || name == "." || path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../"):
		return refusedName
	case len(name) > maxPath:
		return refusedLongName
	}
	for elem := range strings.SplitSeq(name, "/") {
		if len(elem) > maxName {
			return refusedLongName
		}
	}
	return ""
}

// checkParents says why name cannot be written where the diff's own
// entries put its parents, or "".
func (f *diffFilter) checkParents(name string) string {
	for i := 0; i < len(name); i++ {
		if name[i] != '/' {
			continue
		}
		if k, ok := f.names[f.hash(name[:i])]; ok {
			if k == kindSymlink {
				return refusedSymlink
			}
			return refusedNotDir
		}
	}
	return ""
}

// whiteout checks a whiteout entry (base is its name's last element) and
// makes it what overlayfs would: owned by root, without attributes.
func (f *diffFilter) whiteout(hdr *tar.Header, name, base string) (bool, error) {
	parent := path.Dir(name)
	switch {
	case base == whiteoutOpaque:
		if parent == "." {
			return f.refuse(name, refusedOpaque)
		}
	case strings.HasPrefix(base, whiteoutMetaPrefix):
		return f.refuse(name, refusedWhiteout)
	default:
		orig := base[len(whiteoutPrefix):]
		if orig == "" || orig == "." || orig == ".." {
			return f.refuse(name, refusedWhiteout)
		}
		f.names[f.hash(path.Join(parent, orig))] = kindWhiteout
	}
	hdr.Typeflag, hdr.Uid, hdr.Gid, hdr.Mode, hdr.PAXRecords = tar.TypeReg, 0, 0, 0, nil
	return true, nil
}

// vetOwner says why hdr's owner is one the container could not have
// given it, or "".
func (f *diffFilter) vetOwner(hdr *tar.Header, name string) string {
	if hdr.Uid < 0 || hdr.Uid >= math.MaxUint32 || hdr.Gid < 0 || hdr.Gid >= math.MaxUint32 {
		return refusedIDRange
	}
	if !f.p.UserNS {
		return ""
	}
	uid, gid := uint32(hdr.Uid), uint32(hdr.Gid)
	if inRanges(f.p.UIDMap, uid) && inRanges(f.p.GIDMap, gid) {
		return ""
	}
	if f.prior.sameOwner(name, uid, gid) {
		return ""
	}
	return refusedOwner
}

// vetAttrs takes off hdr the set-id bits and extended attributes the
// container could not have set.
func (f *diffFilter) vetAttrs(hdr *tar.Header, name string) {
	uid, gid := uint32(hdr.Uid), uint32(hdr.Gid)
	if hdr.Typeflag != tar.TypeDir {
		if hdr.Mode&0o4000 != 0 && !f.p.AnySetuid && !(f.p.HasUID && uid == f.p.UID) && !f.prior.sameSetID(name, 0o4000, uid) {
			hdr.Mode &^= 0o4000
			f.report.note(&f.report.Stripped, name, strippedSetuid)
		}
		if hdr.Mode&0o2000 != 0 && !f.p.AnySetgid && !slices.Contains(f.p.GIDs, gid) && !f.prior.sameSetID(name, 0o2000, gid) {
			hdr.Mode &^= 0o2000
			f.report.note(&f.report.Stripped, name, strippedSetgid)
		}
	}
	for key, value := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(key, paxXattr)
		if !ok {
			continue
		}
		if reason := f.xattrReason(name, attr, value); reason != "" {
			delete(hdr.PAXRecords, key)
			f.report.note(&f.report.Stripped, name, reason)
		}
	}
}

// xattrReason says why the container could not have set attribute attr
// to value on name, or "".
func (f *diffFilter) xattrReason(name, attr, value string) string {
	switch {
	case strings.HasPrefix(attr, "user."):
		return ""
	case attr == "system.posix_acl_access" || attr == "system.posix_acl_default":
		if f.p.UserNS && !f.aclInMapping(value) {
			return strippedACL
		}
		return ""
	case attr == "security.capability":
		if f.p.SetFcap || f.prior.sameXattr(name, attr, value) {
			return ""
		}
		return strippedFcaps
	case strings.HasPrefix(attr, "trusted."):
		// containerd's archive never sets them, and overlayfs' own
		// would steer the host's overlay.
		return strippedTrusted
	case strings.HasPrefix(attr, "security."):
		return strippedSecurity
	}
	return strippedXattr
}

// The ACL xattr format's version and the tags that name an id
// (linux/posix_acl_xattr.h).
const (
	aclVersion = 2
	aclUser    = 0x02
	aclGroup   = 0x08
)

// aclInMapping reports whether every user and group an ACL (in its xattr
// form: a 4-byte version, then 8-byte entries of tag, permissions, id)
// names is inside the mapping.
func (f *diffFilter) aclInMapping(v string) bool {
	if len(v) < 4 || (len(v)-4)%8 != 0 || binary.LittleEndian.Uint32([]byte(v[:4])) != aclVersion {
		return false
	}
	for e := v[4:]; len(e) >= 8; e = e[8:] {
		tag := binary.LittleEndian.Uint16([]byte(e[0:2]))
		id := binary.LittleEndian.Uint32([]byte(e[4:8]))
		if (tag == aclUser && !inRanges(f.p.UIDMap, id)) || (tag == aclGroup && !inRanges(f.p.GIDMap, id)) {
			return false
		}
	}
	return true
}

func joinDev(major, minor uint32) uint64 { return uint64(major)<<32 | uint64(minor) }
func splitDev(d uint64) (uint32, uint32) { return uint32(d >> 32), uint32(d) }
