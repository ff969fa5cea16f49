package agent

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// runtimeSpecVersion is the newest runtime-spec the guest's OCI runtime
// reads. crun as Debian 12 ships it (1.8.1) takes 1.0 and 1.1 and refuses
// any later ociVersion, while containerd 1.7 writes 1.1 and 2.x writes
// 1.2 or 1.3.
const runtimeSpecVersion = "1.1.0"

// downlevelSpec makes a spec of runtime-spec 1.2 or later readable by a
// 1.1 runtime. Those versions only add things a container may ask for; a
// spec that asks for none of them means the same under 1.1, and gets
// ociVersion 1.1.0. One that asks for one is refused, naming it, rather
// than run without it. Relative mount destinations (1.2) are made
// absolute, which is what they mean. A spec of 1.1 or earlier is left
// alone; a major version other than 1 is refused.
func downlevelSpec(id string, spec *specs.Spec) error {
	newer, err := newerThanRuntime(spec.Version)
	if err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	if !newer {
		return nil
	}
	var unsupported []string
	if spec.Process != nil {
		unsupported = append(unsupported, processAdditions(spec.Process)...)
	}
	for i := range spec.Mounts {
		m := &spec.Mounts[i]
		if m.Destination != "" && !path.IsAbs(m.Destination) {
			m.Destination = path.Join("/", m.Destination)
		}
		for _, o := range []string{"idmap", "ridmap"} {
			if slices.Contains(m.Options, o) {
				unsupported = append(unsupported, fmt.Sprintf("mounts[%s].options %s (idmapped mounts)", m.Destination, o))
			}
		}
	}
	if l := spec.Linux; l != nil {
		if l.MemoryPolicy != nil {
			unsupported = append(unsupported, "linux.memoryPolicy")
		}
		if len(l.NetDevices) > 0 {
			unsupported = append(unsupported, "linux.netDevices")
		}
		if r := l.IntelRdt; r != nil && (len(r.Schemata) > 0 || r.EnableMonitoring) {
			unsupported = append(unsupported, "linux.intelRdt.schemata and enableMonitoring")
		}
	}
	if len(unsupported) > 0 {
		return fmt.Errorf("container %s: the guest's OCI runtime reads runtime-spec %s; this %s spec asks for what came later: %s: %w",
			id, runtimeSpecVersion, spec.Version, strings.Join(unsupported, ", "), errdefs.ErrNotImplemented)
	}
	spec.Version = runtimeSpecVersion
	return nil
}

// processAdditions lists what p asks for that runtime-spec 1.1 lacks. An
// exec's process carries no version of its own, so it is checked always.
func processAdditions(p *specs.Process) []string {
	if p.ExecCPUAffinity != nil {
		return []string{"process.execCPUAffinity"}
	}
	return nil
}

// newerThanRuntime reports whether version (an ociVersion, "1.2.0" or
// "1.0.2-dev") is past runtimeSpecVersion. An empty version is taken as
// the runtime's own.
func newerThanRuntime(version string) (bool, error) {
	if version == "" {
		return false, nil
	}
	core, _, _ := strings.Cut(version, "-")
	parts := strings.Split(core, ".")
	if len(parts) < 2 {
		return false, fmt.Errorf("ociVersion %q: want major.minor.patch: %w", version, errdefs.ErrInvalidArgument)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || major < 0 || minor < 0 {
		return false, fmt.Errorf("ociVersion %q: want major.minor.patch: %w", version, errdefs.ErrInvalidArgument)
	}
	if major != 1 {
		return false, fmt.Errorf("ociVersion %q: the guest's OCI runtime reads runtime-spec 1.x: %w", version, errdefs.ErrNotImplemented)
	}
	return minor > 1, nil
}
