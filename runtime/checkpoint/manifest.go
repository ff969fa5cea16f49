package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/errdefs"
)

// maxManifestBytes bounds manifest.json, read and written.
const maxManifestBytes = 1 << 20

// Manifest is manifest.json: what was saved, and the list of every other
// file of the checkpoint with its size and digest.
type Manifest struct {
	// Format is FormatVersion; Writer.Finish sets it.
	Format int `json:"format"`
	// Created is when the checkpoint was written; Finish sets it if zero.
	Created time.Time `json:"created"`
	// Namespace is the containerd namespace of the sandbox.
	Namespace string `json:"namespace"`
	// SandboxID is the id of the sandbox that was saved.
	SandboxID string `json:"sandbox_id"`
	// Machine is the VM the state was saved from; a restore needs the
	// same (CheckMachine).
	Machine Machine `json:"machine"`
	// Guest is the guest image the VM booted (CheckGuest).
	Guest GuestImage `json:"guest"`
	// State is the file name of the VMM state; it is listed in Files.
	State string `json:"state"`
	// Disks are every disk attached when the VM was saved, in attach
	// order.
	Disks []Disk `json:"disks"`
	// Containers are the sandbox's containers and their processes.
	Containers []Container `json:"containers"`
	// Files are every file of the checkpoint but the manifest; Finish
	// sets them.
	Files []File `json:"files"`
}

// Machine is the VM's shape as far as a migration stream depends on it.
type Machine struct {
	// Driver is the hypervisor driver, "qemu".
	Driver string `json:"driver"`
	// DriverVersion is the VMM's version, e.g. "7.2.19".
	DriverVersion string `json:"driver_version"`
	// MachineType is the VMM's machine type, "microvm".
	MachineType string `json:"machine_type"`
	// VCPUs and MemoryMiB are the VM's size.
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memory_mib"`
	// Accel is how guest instructions ran: "tcg" or "kvm".
	Accel string `json:"accel"`
	// Channel is how the host reached the agent: "virtio-serial" or
	// "vsock".
	Channel string `json:"channel"`
	// KernelArgs is the guest kernel's whole command line.
	KernelArgs []string `json:"kernel_args"`
	// Devices is the boot-time device set, in order, e.g. "virtio-scsi",
	// "virtio-rng", "agent:virtio-serial".
	Devices []string `json:"devices"`
}

// GuestImage names the guest image by its files' digests.
type GuestImage struct {
	// Version is the image's version, for messages.
	Version string `json:"version"`
	// Kernel and Initrd are "sha256:<hex>" of the image's files.
	Kernel string `json:"kernel"`
	Initrd string `json:"initrd"`
}

// DiskAddr is where a disk sat on the guest's SCSI controller.
type DiskAddr struct {
	SCSIID uint32 `json:"scsi_id"`
	LUN    uint32 `json:"lun"`
}

// Roles of a disk.
const (
	// RoleLayer is a read-only layer image, found again by Digest in the
	// layer cache; the checkpoint does not hold it.
	RoleLayer = "layer"
	// RoleScratch is a container's writable disk; the checkpoint holds
	// it, sparse-encoded, as File.
	RoleScratch = "scratch"
)

// Disk is one disk attached to the VM when it was saved.
type Disk struct {
	// ID is the name the disk was attached under in the VM.
	ID string `json:"id"`
	// Addr is where the guest saw it; a restore attaches it there again.
	Addr DiskAddr `json:"addr"`
	// ReadOnly is how it was attached.
	ReadOnly bool `json:"read_only"`
	// Role is RoleLayer or RoleScratch.
	Role string `json:"role"`
	// Container is the id of the container the disk belongs to.
	Container string `json:"container"`
	// Digest is, for RoleLayer, "sha256:<hex>" of the layer image.
	Digest string `json:"digest,omitempty"`
	// File is, for RoleScratch, the name in the checkpoint of the disk's
	// sparse encoding.
	File string `json:"file,omitempty"`
	// Size is, for RoleScratch, the disk's nominal size in bytes.
	Size int64 `json:"size,omitempty"`
}

// Container is one container of the sandbox.
type Container struct {
	// ID is containerd's container id.
	ID string `json:"id"`
	// Processes are the init and the execs the guest ran for it.
	Processes []Process `json:"processes"`
}

// Process is one process of a container.
type Process struct {
	// GuestID is the agent's process id ([A-Za-z0-9._-]{1,64}).
	GuestID string `json:"guest_id"`
	// ExecID is containerd's exec id; "" for the init.
	ExecID string `json:"exec_id,omitempty"`
	// Pid is the process's pid in the guest.
	Pid uint32 `json:"pid"`
	// Terminal says whether it has a terminal; Stdin, Stdout and Stderr
	// which of its stdio streams are connected.
	Terminal bool `json:"terminal"`
	Stdin    bool `json:"stdin"`
	Stdout   bool `json:"stdout"`
	Stderr   bool `json:"stderr"`
}

// File is one file of the checkpoint.
type File struct {
	// Name is a plain name in the checkpoint directory (ValidName).
	Name string `json:"name"`
	// Size is its length in bytes.
	Size int64 `json:"size"`
	// SHA256 is the lower-case hex digest of its content.
	SHA256 string `json:"sha256"`
}

// file returns the listed file named name.
func (m *Manifest) file(name string) (File, bool) {
	for _, f := range m.Files {
		if f.Name == name {
			return f, true
		}
	}
	return File{}, false
}

// ReadManifest reads manifest.json in dir and checks its structure: the
// format, the names, the bounds and the cross references (validate.go).
// It hashes nothing; Verify does. A directory that does not exist is
// errdefs.ErrNotFound; every refusal of what is in it wraps ErrInvalid.
func ReadManifest(dir string) (*Manifest, error) {
	st, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("checkpoint %s: no such directory: %w", dir, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	if !st.IsDir() {
		return nil, invalidf(dir, "not a directory")
	}
	f, size, err := openRegular(dir, ManifestName)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if size > maxManifestBytes {
		return nil, invalidf(dir, "%s is %d bytes, over the bound of %d", ManifestName, size, maxManifestBytes)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: read %s: %w", dir, ManifestName, err)
	}
	if len(data) > maxManifestBytes {
		return nil, invalidf(dir, "%s is over the bound of %d bytes", ManifestName, maxManifestBytes)
	}
	m, err := decodeManifest(data)
	if err != nil {
		return nil, invalidf(dir, "%v", err)
	}
	return m, nil
}

// decodeManifest parses and validates a manifest. The format is read on
// its own first, so that a newer manifest is refused for its format and
// not for the fields this build does not know (that first decode also
// refuses data after the JSON value); format 1 is then decoded strictly,
// so that a misspelt field of a hand edit is not silently dropped.
func decodeManifest(data []byte) (*Manifest, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) || errors.Is(err, io.ErrUnexpectedEOF) || len(bytes.TrimSpace(data)) == 0 {
			return nil, fmt.Errorf("%s is not valid JSON: %v", ManifestName, err)
		}
		return nil, fmt.Errorf("%s is not a JSON object", ManifestName)
	}
	format := 0
	if raw, ok := top["format"]; ok {
		if err := json.Unmarshal(raw, &format); err != nil {
			return nil, fmt.Errorf("%s has format %.32s, not a number", ManifestName, raw)
		}
	}
	if err := checkFormat(format); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%s is not a valid manifest: %v", ManifestName, err)
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// checkFormat refuses every format but FormatVersion, saying which.
func checkFormat(format int) error {
	switch {
	case format == FormatVersion:
		return nil
	case format > FormatVersion:
		return fmt.Errorf("%s has format %d, newer than this build reads (%d): restore with a newer cocoon", ManifestName, format, FormatVersion)
	default:
		return fmt.Errorf("%s has format %d, this build reads format %d", ManifestName, format, FormatVersion)
	}
}
