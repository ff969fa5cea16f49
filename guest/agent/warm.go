package agent

import (
	"encoding/json"
	"io/fs"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// warmSpecCodecs has encoding/json build its decoders and encoders for
// the OCI spec types, which it does on first use. In the emulated guest
// that first use costs about 80 ms, and the first container's create
// would pay it; the agent runs this once the guest is synced, while the
// host prepares the container's disks. An error means the sample did not
// round-trip, which only a change of the spec types could cause.
func warmSpecCodecs() error {
	one := []string{"x"}
	spec := &specs.Spec{
		Version:  specs.Version,
		Hostname: "x",
		Process: &specs.Process{
			Terminal:    true,
			ConsoleSize: &specs.Box{Height: 1, Width: 1},
			User:        specs.User{UID: 1, GID: 1, AdditionalGids: []uint32{1}, Umask: new(uint32(1))},
			Args:        one, Env: one, Cwd: "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: one, Effective: one, Inheritable: one, Permitted: one, Ambient: one,
			},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1, Soft: 1}},
			NoNewPrivileges: true,
			OOMScoreAdj:     new(1),
		},
		Root:        &specs.Root{Path: "x", Readonly: true},
		Mounts:      []specs.Mount{{Destination: "/x", Type: "tmpfs", Source: "x", Options: one}},
		Annotations: map[string]string{"x": "x"},
		Linux: &specs.Linux{
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 1, HostID: 1, Size: 1}},
			Sysctl:      map[string]string{"x": "x"},
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: true, Type: "c", Major: new(int64(1)), Minor: new(int64(1)), Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: new(int64(1)), Swap: new(int64(1))},
				CPU:     &specs.LinuxCPU{Shares: new(uint64(1)), Quota: new(int64(1)), Period: new(uint64(1)), Cpus: "0"},
				Pids:    &specs.LinuxPids{Limit: new(int64(1))},
				BlockIO: &specs.LinuxBlockIO{Weight: new(uint16(1))},
				Unified: map[string]string{"x": "x"},
			},
			CgroupsPath: "/x",
			Namespaces:  []specs.LinuxNamespace{{Type: specs.PIDNamespace}},
			Devices:     []specs.LinuxDevice{{Path: "/dev/x", Type: "c", Major: 1, Minor: 1, FileMode: new(fs.FileMode(0o666)), UID: new(uint32(0)), GID: new(uint32(0))}},
			Seccomp: &specs.LinuxSeccomp{
				DefaultAction: specs.ActErrno, Architectures: []specs.Arch{specs.ArchX86_64}, Flags: []specs.LinuxSeccompFlag{"x"},
				Syscalls: []specs.LinuxSyscall{{Names: one, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 1, Value: 1, Op: specs.OpEqualTo}}}},
			},
			MaskedPaths:   one,
			ReadonlyPaths: one,
		},
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &specs.Spec{}); err != nil {
		return err
	}
	if data, err = json.Marshal(spec.Process); err != nil {
		return err
	}
	return json.Unmarshal(data, &specs.Process{})
}
