package checkpoint

import (
	"fmt"
	"regexp"
	"unicode"
	"unicode/utf8"

	"github.com/cocoonrt/cocoon/guest/api"
)

// Bounds of a manifest. They are far above what a sandbox uses and keep
// what a hand-edited manifest can make a restore allocate or loop over
// small.
const (
	maxContainers = 64
	maxDisks      = 128
	maxProcesses  = 1024 // per container
	maxFiles      = 512
	// maxListLen and maxArgBytes bound the kernel arguments and the
	// devices.
	maxListLen  = 64
	maxArgBytes = 4096
	// maxTextBytes bounds the other free-text fields.
	maxTextBytes = 256
	// maxExecIDBytes bounds an exec id; containerd does not bound them.
	maxExecIDBytes = 1024
	maxVCPUs       = 1024
	maxMemoryMiB   = 1 << 24 // 16 TiB
	// maxFileBytes bounds a listed file and a scratch disk's nominal size.
	maxFileBytes = 1 << 44 // 16 TiB
)

// diskIDPattern is a disk id as the qemu driver takes them; the sandbox
// makes them of a container id and a suffix.
var diskIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// hexPattern is a sha256 digest in lower-case hex.
var hexPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// validDigest checks a "sha256:<hex>" digest.
func validDigest(d string) bool {
	return len(d) == len("sha256:")+64 && d[:7] == "sha256:" && hexPattern.MatchString(d[7:])
}

// text checks a free-text field: valid UTF-8, no control characters
// (so that printing it cannot drive a terminal), at most max bytes.
func text(what, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%s is %d bytes, over the bound of %d", what, len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %q is not valid UTF-8", what, s)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s %q holds a control character", what, s)
		}
	}
	return nil
}

// validate checks everything of the manifest that needs no file: the
// format, the ids and names, the bounds, and that every reference (the
// state, a scratch disk's file, a disk's container) names something the
// manifest lists. Its errors are reasons; the callers say which
// checkpoint.
func (m *Manifest) validate() error {
	if err := checkFormat(m.Format); err != nil {
		return err
	}
	if err := validID("namespace", m.Namespace); err != nil {
		return err
	}
	if err := validID("sandbox_id", m.SandboxID); err != nil {
		return err
	}
	if err := m.Machine.validate(); err != nil {
		return err
	}
	if err := m.Guest.validate(); err != nil {
		return err
	}
	if err := m.validateFiles(); err != nil {
		return err
	}
	if m.State == "" {
		return fmt.Errorf("manifest names no state file")
	}
	if _, ok := m.file(m.State); !ok {
		return fmt.Errorf("state file %q is not listed in files", m.State)
	}
	if err := m.validateContainers(); err != nil {
		return err
	}
	return m.validateDisks()
}

func (mc *Machine) validate() error {
	if mc.Driver == "" {
		return fmt.Errorf("machine names no driver")
	}
	for _, f := range []struct{ what, s string }{
		{"machine driver", mc.Driver},
		{"machine driver_version", mc.DriverVersion},
		{"machine machine_type", mc.MachineType},
		{"machine accel", mc.Accel},
		{"machine channel", mc.Channel},
	} {
		if err := text(f.what, f.s, maxTextBytes); err != nil {
			return err
		}
	}
	if mc.VCPUs <= 0 || mc.VCPUs > maxVCPUs {
		return fmt.Errorf("machine vcpus %d: want 1-%d", mc.VCPUs, maxVCPUs)
	}
	if mc.MemoryMiB <= 0 || mc.MemoryMiB > maxMemoryMiB {
		return fmt.Errorf("machine memory_mib %d: want 1-%d", mc.MemoryMiB, maxMemoryMiB)
	}
	for _, l := range []struct {
		what string
		list []string
	}{{"kernel_args", mc.KernelArgs}, {"devices", mc.Devices}} {
		if len(l.list) > maxListLen {
			return fmt.Errorf("machine %s: %d entries, over the bound of %d", l.what, len(l.list), maxListLen)
		}
		for i, s := range l.list {
			if err := text(fmt.Sprintf("machine %s[%d]", l.what, i), s, maxArgBytes); err != nil {
				return err
			}
		}
	}
	return nil
}

func (g *GuestImage) validate() error {
	if err := text("guest version", g.Version, maxTextBytes); err != nil {
		return err
	}
	if !validDigest(g.Kernel) {
		return fmt.Errorf("guest kernel %q is not a sha256:<hex> digest", g.Kernel)
	}
	if !validDigest(g.Initrd) {
		return fmt.Errorf("guest initrd %q is not a sha256:<hex> digest", g.Initrd)
	}
	return nil
}

func (m *Manifest) validateFiles() error {
	if len(m.Files) > maxFiles {
		return fmt.Errorf("manifest lists %d files, over the bound of %d", len(m.Files), maxFiles)
	}
	seen := make(map[string]bool, len(m.Files))
	for _, f := range m.Files {
		if ValidName(f.Name) != nil {
			return fmt.Errorf("manifest names file %q: not a plain name", f.Name)
		}
		if f.Name == ManifestName {
			return fmt.Errorf("manifest lists itself as a file")
		}
		if seen[f.Name] {
			return fmt.Errorf("manifest lists file %q twice", f.Name)
		}
		seen[f.Name] = true
		if f.Size < 0 || f.Size > maxFileBytes {
			return fmt.Errorf("file %q: size %d is out of range (0-%d)", f.Name, f.Size, int64(maxFileBytes))
		}
		if !hexPattern.MatchString(f.SHA256) {
			return fmt.Errorf("file %q: sha256 %q is not 64 lower-case hex digits", f.Name, f.SHA256)
		}
	}
	return nil
}

func (m *Manifest) validateContainers() error {
	if len(m.Containers) > maxContainers {
		return fmt.Errorf("manifest lists %d containers, over the bound of %d", len(m.Containers), maxContainers)
	}
	ids := make(map[string]bool, len(m.Containers))
	guestIDs := make(map[string]string)
	for _, c := range m.Containers {
		if err := validID("container id", c.ID); err != nil {
			return err
		}
		if ids[c.ID] {
			return fmt.Errorf("manifest lists container %q twice", c.ID)
		}
		ids[c.ID] = true
		if len(c.Processes) > maxProcesses {
			return fmt.Errorf("container %q: %d processes, over the bound of %d", c.ID, len(c.Processes), maxProcesses)
		}
		execs := make(map[string]bool, len(c.Processes))
		for _, p := range c.Processes {
			if api.ValidID(p.GuestID) != nil {
				return fmt.Errorf("container %q: guest process id %q: want 1-%d characters of [A-Za-z0-9._-]", c.ID, p.GuestID, api.MaxIDLen)
			}
			if other, ok := guestIDs[p.GuestID]; ok {
				return fmt.Errorf("container %q: guest process id %q is also a process of container %q", c.ID, p.GuestID, other)
			}
			guestIDs[p.GuestID] = c.ID
			if err := text(fmt.Sprintf("container %q: exec_id", c.ID), p.ExecID, maxExecIDBytes); err != nil {
				return err
			}
			if execs[p.ExecID] {
				if p.ExecID == "" {
					return fmt.Errorf("container %q has two init processes", c.ID)
				}
				return fmt.Errorf("container %q: exec %q is listed twice", c.ID, p.ExecID)
			}
			execs[p.ExecID] = true
		}
	}
	return nil
}

func (m *Manifest) validateDisks() error {
	if len(m.Disks) > maxDisks {
		return fmt.Errorf("manifest lists %d disks, over the bound of %d", len(m.Disks), maxDisks)
	}
	containers := make(map[string]bool, len(m.Containers))
	for _, c := range m.Containers {
		containers[c.ID] = true
	}
	ids := make(map[string]bool, len(m.Disks))
	targets := make(map[uint32]string, len(m.Disks))
	files := map[string]string{m.State: "the VMM state"}
	for _, d := range m.Disks {
		if !diskIDPattern.MatchString(d.ID) {
			return fmt.Errorf("disk id %q: want 1-128 characters of [A-Za-z0-9._-], starting alphanumeric", d.ID)
		}
		if ids[d.ID] {
			return fmt.Errorf("manifest lists disk %q twice", d.ID)
		}
		ids[d.ID] = true
		if other, ok := targets[d.Addr.SCSIID]; ok {
			return fmt.Errorf("disks %q and %q share scsi_id %d", other, d.ID, d.Addr.SCSIID)
		}
		targets[d.Addr.SCSIID] = d.ID
		if !containers[d.Container] {
			return fmt.Errorf("disk %q belongs to container %q, which the manifest does not list", d.ID, d.Container)
		}
		switch d.Role {
		case RoleLayer:
			if !validDigest(d.Digest) {
				return fmt.Errorf("layer disk %q: digest %q is not a sha256:<hex> digest", d.ID, d.Digest)
			}
			if d.File != "" || d.Size != 0 {
				return fmt.Errorf("layer disk %q names a file or a size; a layer is found by its digest", d.ID)
			}
		case RoleScratch:
			if d.Digest != "" {
				return fmt.Errorf("scratch disk %q names a digest; a scratch disk is held as a file", d.ID)
			}
			if _, ok := m.file(d.File); !ok {
				return fmt.Errorf("scratch disk %q: file %q is not listed in files", d.ID, d.File)
			}
			if other, ok := files[d.File]; ok {
				return fmt.Errorf("scratch disk %q: file %q is also %s", d.ID, d.File, other)
			}
			files[d.File] = fmt.Sprintf("the file of disk %q", d.ID)
			if d.Size <= 0 || d.Size > maxFileBytes {
				return fmt.Errorf("scratch disk %q: size %d is out of range (1-%d)", d.ID, d.Size, int64(maxFileBytes))
			}
		default:
			return fmt.Errorf("disk %q: unknown role %q (want %q or %q)", d.ID, d.Role, RoleLayer, RoleScratch)
		}
	}
	return nil
}
