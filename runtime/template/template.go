// Package template keeps the templates sandboxes start from instead of
// booting: a guest booted once, its agent ready, saved with its RAM in a
// file. Each template is the saved state of one VM shape (Shape), in a
// directory named by the shape's key under <data_dir>/templates:
//
//	<key>/template.json  the manifest: shape, machine, files with digests
//	<key>/vm.state       the VMM's device and vCPU state (no RAM)
//	<key>/memory         guest RAM, which clones map privately
//	<key>/verified.json  the stamp of the last full verification
//	<key>.failed         why the last automatic creation failed
//
// The package knows the files, not VMs: the sandbox package boots and
// saves the guest through Store.Create's build function, and clones it
// from a Template that Lookup verified.
package template

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/checkpoint"
)

// DirName is the directory of templates under the data directory.
const DirName = "templates"

// File names in a template directory.
const (
	ManifestName = "template.json"
	StateName    = "vm.state"
	MemoryName   = "memory"
	stampName    = "verified.json"
	failedSuffix = ".failed"
	lockName     = ".create.lock"
	tmpPrefix    = ".tmp-"
)

// FormatVersion is the manifest format this package writes and reads.
const FormatVersion = 1

// keyVersion is hashed into every key: a change of what a key covers, or
// of how a template is made, changes every key.
const keyVersion = "cocoon-template-v1"

// ErrStale is wrapped by the errors of a template that exists but does
// not fit the shape asked for, or does not hold together: it is ignored,
// never loaded, and `cocoon gc` removes it.
var ErrStale = errors.New("stale or corrupt template")

// Shape is everything a template's saved state depends on: two sandboxes
// of one shape can start from one template, and anything that might keep
// a saved state from loading, or make a clone differ from a cold boot,
// is part of it. Devices is the boot-time device set as the driver
// names it; NICs join it as devices, with no change of format.
type Shape struct {
	// Driver is the hypervisor driver; VMM and VMMID the VMM binary and
	// its identity on disk (hypervisor.Plan).
	Driver string `json:"driver"`
	VMM    string `json:"vmm"`
	VMMID  string `json:"vmm_id"`
	// MachineType and Devices are the machine the driver builds.
	MachineType string   `json:"machine_type"`
	Devices     []string `json:"devices"`
	// VCPUs and MemoryMiB size the guest.
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memory_mib"`
	// Accel and Channel are the resolved accelerator and agent channel.
	Accel   string `json:"accel"`
	Channel string `json:"channel"`
	// KernelArgs are the kernel arguments the sandbox adds to the
	// driver's own.
	KernelArgs []string `json:"kernel_args"`
	// Guest is the guest image, by digest.
	Guest checkpoint.GuestImage `json:"guest"`
}

// Key is the shape's key: the name of its template's directory.
func (s Shape) Key() string {
	data, err := json.Marshal(s)
	if err != nil {
		// A struct of strings and ints always encodes.
		panic(err)
	}
	h := sha256.New()
	h.Write([]byte(keyVersion + "\n"))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// Equal says whether two shapes are the same.
func (s Shape) Equal(o Shape) bool { return len(s.diff(o)) == 0 }

// diff names the fields in which s differs from o, for the log line of a
// stale template.
func (s Shape) diff(o Shape) []string {
	var d []string
	add := func(what string, differs bool) {
		if differs {
			d = append(d, what)
		}
	}
	add("driver", s.Driver != o.Driver)
	add("vmm binary", s.VMM != o.VMM || s.VMMID != o.VMMID)
	add("machine type", s.MachineType != o.MachineType)
	add("devices", !slices.Equal(s.Devices, o.Devices))
	add("vcpus", s.VCPUs != o.VCPUs)
	add("memory", s.MemoryMiB != o.MemoryMiB)
	add("accelerator", s.Accel != o.Accel)
	add("agent channel", s.Channel != o.Channel)
	add("kernel arguments", !slices.Equal(s.KernelArgs, o.KernelArgs))
	add("guest image", s.Guest != o.Guest)
	return d
}

// Manifest is template.json.
type Manifest struct {
	// Format is FormatVersion.
	Format int `json:"format"`
	// Key is Shape.Key(), and the directory's name.
	Key string `json:"key"`
	// Created is when the template was saved.
	Created time.Time `json:"created"`
	// Shape is what the template is the state of.
	Shape Shape `json:"shape"`
	// Machine is the VM as it ran when saved, its VMM version included;
	// a clone's VMM must be the same machine (checked at launch).
	Machine checkpoint.Machine `json:"machine"`
	// State and Memory are the file names of the VMM state and of guest
	// RAM; both are listed in Files.
	State  string `json:"state"`
	Memory string `json:"memory"`
	// Files are the template's files with their sizes and digests.
	Files []checkpoint.File `json:"files"`
	// BootMillis is how long the template's guest took from launch to a
	// ready agent; SaveMillis how long its save took.
	BootMillis int64 `json:"boot_ms"`
	SaveMillis int64 `json:"save_ms"`
}

// keyPattern is what a key looks like.
var keyPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// ValidKey checks that key is a template key, as a CLI argument or a
// directory name.
func ValidKey(key string) error {
	if !keyPattern.MatchString(key) {
		return fmt.Errorf("template key %q: want 32 lower-case hex digits: %w", key, errdefs.ErrInvalidArgument)
	}
	return nil
}

// maxManifestBytes bounds template.json.
const maxManifestBytes = 1 << 20

// decodeManifest reads and checks a manifest.
func decodeManifest(data []byte, key string) (*Manifest, error) {
	if len(data) > maxManifestBytes {
		return nil, fmt.Errorf("%s is %d bytes, over the bound of %d", ManifestName, len(data), maxManifestBytes)
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%s: %v", ManifestName, err)
	}
	if m.Format != FormatVersion {
		return nil, fmt.Errorf("%s: format %d, this version reads %d", ManifestName, m.Format, FormatVersion)
	}
	if m.Key != key {
		return nil, fmt.Errorf("%s names key %q, the directory is %q", ManifestName, m.Key, key)
	}
	if got := m.Shape.Key(); got != key {
		return nil, &shapeKeyError{shape: m.Shape, got: got, key: key}
	}
	if m.State != StateName || m.Memory != MemoryName {
		return nil, fmt.Errorf("%s names files %q and %q, want %q and %q", ManifestName, m.State, m.Memory, StateName, MemoryName)
	}
	if len(m.Files) != 2 {
		return nil, fmt.Errorf("%s lists %d files, want %s and %s", ManifestName, len(m.Files), StateName, MemoryName)
	}
	for _, name := range []string{StateName, MemoryName} {
		f, ok := m.file(name)
		if !ok {
			return nil, fmt.Errorf("%s does not list %s", ManifestName, name)
		}
		if f.Size <= 0 || !hexDigest.MatchString(f.SHA256) {
			return nil, fmt.Errorf("%s: file %s: size %d or sha256 %q is invalid", ManifestName, name, f.Size, f.SHA256)
		}
	}
	if mem, _ := m.file(MemoryName); mem.Size != int64(m.Shape.MemoryMiB)<<20 {
		return nil, fmt.Errorf("%s: memory file of %d bytes for a guest of %d MiB", ManifestName, mem.Size, m.Shape.MemoryMiB)
	}
	if m.Machine.VCPUs != m.Shape.VCPUs || m.Machine.MemoryMiB != m.Shape.MemoryMiB || m.Machine.Driver != m.Shape.Driver {
		return nil, fmt.Errorf("%s: its machine does not match its shape", ManifestName)
	}
	return &m, nil
}

// shapeKeyError is decodeManifest's error for a manifest whose shape is
// not the shape of its key: Lookup, which knows the shape it asked for,
// names the fields that differ.
type shapeKeyError struct {
	shape    Shape
	got, key string
}

func (e *shapeKeyError) Error() string {
	return fmt.Sprintf("%s: its shape's key is %s, not %s", ManifestName, e.got, e.key)
}

var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// file returns the listed file named name.
func (m *Manifest) file(name string) (checkpoint.File, bool) {
	for _, f := range m.Files {
		if f.Name == name {
			return f, true
		}
	}
	return checkpoint.File{}, false
}
