package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}

// editManifest rewrites dir's manifest as edit changes it, unchecked.
func editManifest(t *testing.T, dir string, edit func(m *Manifest)) {
	t.Helper()
	p := filepath.Join(dir, ManifestName)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(&m)
	if data, err = json.Marshal(&m); err != nil {
		t.Fatal(err)
	}
	writeManifestRaw(t, dir, data)
}

func writeManifestRaw(t *testing.T, dir string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, ManifestName), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// editFile changes a checkpoint's file in place.
func editFile(t *testing.T, dir, name string, edit func([]byte) []byte) {
	t.Helper()
	p := filepath.Join(dir, name)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, edit(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// replaceWith puts what make makes in place of the checkpoint's file name.
func replaceWith(t *testing.T, dir, name string, make func(p string) error) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := make(p); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyRefusals(t *testing.T) {
	digest := strings.Repeat("9a", 32)
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, dir string, m *Manifest)
		want   string
	}{
		{"byte flipped", func(t *testing.T, dir string, m *Manifest) {
			editFile(t, dir, StateName, func(b []byte) []byte { b[1000] ^= 1; return b })
		}, `file "vm.state": sha256 is `},
		{"byte flipped in a disk", func(t *testing.T, dir string, m *Manifest) {
			editFile(t, dir, "disk-c1.sparse", func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b })
		}, `file "disk-c1.sparse": sha256 is `},
		{"file removed", func(t *testing.T, dir string, m *Manifest) {
			os.Remove(filepath.Join(dir, "disk-c1.sparse"))
		}, `file "disk-c1.sparse" is missing`},
		{"file truncated", func(t *testing.T, dir string, m *Manifest) {
			editFile(t, dir, StateName, func(b []byte) []byte { return b[:1000] })
		}, `file "vm.state" is 1000 bytes, the manifest says 2000`},
		{"file grown", func(t *testing.T, dir string, m *Manifest) {
			editFile(t, dir, StateName, func(b []byte) []byte { return append(b, 0) })
		}, `file "vm.state" is 2001 bytes, the manifest says 2000`},
		{"manifest edited to another digest", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Files[0].SHA256 = digest })
		}, `file "vm.state": sha256 is ` + sha256Hex(fixtureState()) + `, the manifest says ` + digest},
		{"manifest names ../x", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Files[1].Name = "../x"; m.Disks[1].File = "../x" })
		}, `manifest names file "../x": not a plain name`},
		{"manifest names a/b", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Files[0].Name = "a/b"; m.State = "a/b" })
		}, `manifest names file "a/b": not a plain name`},
		{"manifest names .", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Files[0].Name = "."; m.State = "." })
		}, `manifest names file ".": not a plain name`},
		{"manifest names an absolute path", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Files[0].Name = "/etc/passwd"; m.State = "/etc/passwd" })
		}, `manifest names file "/etc/passwd": not a plain name`},
		{"manifest lists itself", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Files[0].Name = ManifestName; m.State = ManifestName })
		}, `manifest lists itself`},
		{"symlink instead of a file", func(t *testing.T, dir string, m *Manifest) {
			os.WriteFile(filepath.Join(dir, "elsewhere"), nil, 0o600)
			replaceWith(t, dir, StateName, func(p string) error { return os.Symlink("elsewhere", p) })
		}, `file "vm.state" is a symlink`},
		{"symlink instead of the manifest", func(t *testing.T, dir string, m *Manifest) {
			os.Rename(filepath.Join(dir, ManifestName), filepath.Join(dir, "real"))
			os.Symlink("real", filepath.Join(dir, ManifestName))
		}, `file "manifest.json" is a symlink`},
		{"FIFO instead of a file", func(t *testing.T, dir string, m *Manifest) {
			replaceWith(t, dir, StateName, func(p string) error { return unix.Mkfifo(p, 0o600) })
		}, `file "vm.state" is not a regular file: it is a FIFO`},
		{"directory instead of a file", func(t *testing.T, dir string, m *Manifest) {
			replaceWith(t, dir, StateName, func(p string) error { return os.Mkdir(p, 0o700) })
		}, `file "vm.state" is not a regular file: it is a directory`},
		{"no manifest", func(t *testing.T, dir string, m *Manifest) {
			os.Remove(filepath.Join(dir, ManifestName))
		}, `file "manifest.json" is missing`},
		{"unknown format", func(t *testing.T, dir string, m *Manifest) {
			writeManifestRaw(t, dir, []byte(`{"format": 3, "shiny_new_field": true}`))
		}, `manifest.json has format 3, newer than this build reads (2)`},
		{"format 0", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Format = 0 })
		}, `manifest.json has format 0, this build reads format 2`},
		{"malformed JSON", func(t *testing.T, dir string, m *Manifest) {
			editFile(t, dir, ManifestName, func(b []byte) []byte { return b[:len(b)/2] })
		}, `manifest.json is not valid JSON`},
		{"empty manifest", func(t *testing.T, dir string, m *Manifest) {
			writeManifestRaw(t, dir, nil)
		}, `manifest.json is not valid JSON`},
		{"not an object", func(t *testing.T, dir string, m *Manifest) {
			writeManifestRaw(t, dir, []byte(`[1]`))
		}, `manifest.json is not a JSON object`},
		{"format not a number", func(t *testing.T, dir string, m *Manifest) {
			writeManifestRaw(t, dir, []byte(`{"format": "1"}`))
		}, `manifest.json has format "1", not a number`},
		{"unknown field", func(t *testing.T, dir string, m *Manifest) {
			editFile(t, dir, ManifestName, func(b []byte) []byte {
				return bytes.Replace(b, []byte(`"state":`), []byte(`"sate": 1, "state":`), 1)
			})
		}, `unknown field "sate"`},
		{"data after the manifest", func(t *testing.T, dir string, m *Manifest) {
			editFile(t, dir, ManifestName, func(b []byte) []byte { return append(b, "{}"...) })
		}, `manifest.json is not valid JSON: invalid character '{' after top-level value`},
		{"oversize manifest", func(t *testing.T, dir string, m *Manifest) {
			editFile(t, dir, ManifestName, func(b []byte) []byte { return append(b, bytes.Repeat([]byte(" "), maxManifestBytes)...) })
		}, `manifest.json is 1`},
		{"duplicate names", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Files = append(m.Files, m.Files[0]) })
		}, `manifest lists file "vm.state" twice`},
		{"scratch disk file not listed", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Disks[1].File = "disk-x.sparse" })
		}, `scratch disk "c1-scratch": file "disk-x.sparse" is not listed in files`},
		{"scratch disk file is the state", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Disks[1].File = StateName })
		}, `file "vm.state" is also the VMM state`},
		{"state not listed", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.State = "other" })
		}, `state file "other" is not listed in files`},
		{"negative size", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Files[0].Size = -1 })
		}, `file "vm.state": size -1 is out of range`},
		{"upper-case digest", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Files[0].SHA256 = strings.ToUpper(m.Files[0].SHA256) })
		}, `is not 64 lower-case hex digits`},
		{"bad namespace", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Namespace = "../ns" })
		}, `namespace "../ns": want 1-76 characters`},
		{"bad sandbox id", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.SandboxID = "" })
		}, `sandbox_id "": want 1-76 characters`},
		{"no vcpus", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Machine.VCPUs = 0 })
		}, `machine vcpus 0`},
		{"no memory", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Machine.MemoryMiB = -5 })
		}, `machine memory_mib -5`},
		{"too many kernel args", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Machine.KernelArgs = make([]string, maxListLen+1) })
		}, `machine kernel_args: 65 entries, over the bound of 64`},
		{"kernel arg too long", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Machine.KernelArgs[1] = strings.Repeat("x", maxArgBytes+1) })
		}, `machine kernel_args[1] is 4097 bytes`},
		{"control character in a device", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Machine.Devices[0] = "virtio\x1b[2J" })
		}, `machine devices[0] "virtio\x1b[2J" holds a control character`},
		{"bad guest digest", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Guest.Initrd = "md5:00" })
		}, `guest initrd "md5:00" is not a sha256:<hex> digest`},
		{"bad layer digest", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Disks[0].Digest = "sha256:xyz" })
		}, `layer disk "c1-layer-0": digest "sha256:xyz"`},
		{"layer disk with a file", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Disks[0].File = StateName })
		}, `layer disk "c1-layer-0" names a file`},
		{"unknown role", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Disks[0].Role = "swap" })
		}, `disk "c1-layer-0": unknown role "swap"`},
		{"duplicate disk id", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Disks[1].ID = m.Disks[0].ID })
		}, `manifest lists disk "c1-layer-0" twice`},
		{"bad disk id", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Disks[1].ID = "a,b" })
		}, `disk id "a,b"`},
		{"shared scsi id", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Disks[1].Addr.SCSIID = 0 })
		}, `disks "c1-layer-0" and "c1-scratch" share scsi_id 0`},
		{"disk of no container", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Disks[0].Container = "c9" })
		}, `disk "c1-layer-0" belongs to container "c9", which the manifest does not list`},
		{"scratch disk without a size", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Disks[1].Size = 0 })
		}, `scratch disk "c1-scratch": size 0 is out of range`},
		{"duplicate container", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) {
				m.Containers = append(m.Containers, Container{ID: "c1"})
			})
		}, `manifest lists container "c1" twice`},
		{"too many containers", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) {
				for i := range maxContainers {
					m.Containers = append(m.Containers, Container{ID: fmt.Sprintf("x%d", i)})
				}
			})
		}, `manifest lists 65 containers, over the bound of 64`},
		{"too many processes", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Containers[0].Processes = make([]Process, maxProcesses+1) })
		}, `container "c1": 1025 processes, over the bound of 1024`},
		{"bad guest id", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Containers[0].Processes[1].GuestID = "p/2" })
		}, `container "c1": guest process id "p/2"`},
		{"duplicate guest id", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) {
				m.Containers = append(m.Containers, Container{ID: "c2", Processes: []Process{{GuestID: "p2"}}})
			})
		}, `container "c2": guest process id "p2" is also a process of container "c1"`},
		{"two inits", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) { m.Containers[0].Processes[1].ExecID = "" })
		}, `container "c1" has two init processes`},
		{"too many files", func(t *testing.T, dir string, m *Manifest) {
			editManifest(t, dir, func(m *Manifest) {
				for i := range maxFiles {
					m.Files = append(m.Files, File{Name: fmt.Sprintf("f%d", i), SHA256: m.Files[0].SHA256})
				}
			})
		}, `manifest lists 514 files, over the bound of 512`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir, m, _ := writeFixture(t)
			tc.tamper(t, dir, m)
			_, err := Verify(dir)
			if err == nil {
				t.Fatal("Verify passed")
			}
			t.Log(err)
			if !errors.Is(err, ErrInvalid) || !errdefs.IsInvalidArgument(err) {
				t.Errorf("error %v: want ErrInvalid and invalid argument", err)
			}
			if want := "checkpoint " + dir + ": "; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("error %q does not start with %q", err, want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func TestVerifyIgnoresUnlistedFiles(t *testing.T) {
	dir, _, _ := writeFixture(t)
	os.Symlink("/etc/passwd", filepath.Join(dir, "passwd"))
	unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600)
	os.WriteFile(filepath.Join(dir, "extra"), []byte("junk"), 0o600)
	if _, err := Verify(dir); err != nil {
		t.Errorf("Verify with unlisted files beside: %v", err)
	}
}

func TestReadManifestOfNoDirectory(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadManifest(filepath.Join(dir, "absent")); !errdefs.IsNotFound(err) {
		t.Errorf("ReadManifest of a missing directory: %v, want not found", err)
	}
	f := filepath.Join(dir, "file")
	os.WriteFile(f, nil, 0o600)
	if _, err := ReadManifest(f); !errors.Is(err, ErrInvalid) {
		t.Errorf("ReadManifest of a file: %v, want ErrInvalid", err)
	}
}

// TestReadManifestHashesNothing: a tampered file passes ReadManifest,
// which only reads the manifest.
func TestReadManifestHashesNothing(t *testing.T) {
	dir, _, _ := writeFixture(t)
	editFile(t, dir, StateName, func(b []byte) []byte { b[0] ^= 1; return b })
	if _, err := ReadManifest(dir); err != nil {
		t.Errorf("ReadManifest: %v", err)
	}
}

func TestOpen(t *testing.T) {
	dir, m, state := writeFixture(t)
	f, err := Open(dir, m, StateName)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(state)+1)
	n, _ := f.Read(got)
	f.Close()
	if !bytes.Equal(got[:n], state) {
		t.Errorf("Open read %d bytes, not the state", n)
	}
	if _, err := f.Write([]byte("x")); err == nil {
		t.Errorf("the file Open returns is writable")
	}

	os.WriteFile(filepath.Join(dir, "extra"), nil, 0o600)
	if _, err := Open(dir, m, "extra"); !errdefs.IsNotFound(err) {
		t.Errorf("Open of an unlisted file: %v, want not found", err)
	}
	if _, err := Open(dir, m, "../x"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Open of ../x: %v, want invalid argument", err)
	}
	editFile(t, dir, StateName, func(b []byte) []byte { return b[:10] })
	if _, err := Open(dir, m, StateName); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "is 10 bytes, the manifest says 2000") {
		t.Errorf("Open of a truncated file: %v", err)
	}
	replaceWith(t, dir, StateName, func(p string) error { return os.Symlink("extra", p) })
	if _, err := Open(dir, m, StateName); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("Open of a symlink: %v", err)
	}
}
