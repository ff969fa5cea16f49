package agent

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// runtimeSpecVersion is the newest runtime-spec the guest's OCI runtime
// reads. crun as Debian 12 ships it (1.8.1) takes 1.0 and 1.1 and refuses
// any later ociVersion, while containerd 1.7 writes 1.1 and 2.x writes
// 1.2 or 1.3.
const runtimeSpecVersion = "1.1.0"

// bundleSpec is a container's OCI spec as the agent handles it: the few
// fields it reads or changes are decoded, everything else stays as the
// host sent it, for the OCI runtime to read. Decoding the whole spec into
// runtime-spec's types made encoding/json build its decoders for that
// type graph on first use, which cost the first container of every VM
// about 80 ms under TCG.
type bundleSpec struct {
	// doc is the spec's top level; the sections below are written back
	// into it by marshal.
	doc     map[string]json.RawMessage
	process rawObject
	linux   rawObject
	// Version is ociVersion.
	Version string
	// Terminal and Args are the process's.
	Terminal bool
	Args     []string
	// CgroupsPath is linux.cgroupsPath.
	CgroupsPath string
	// ReadonlyRoot is root.readonly.
	ReadonlyRoot bool
}

// rawObject is a JSON object whose members are kept as they are.
type rawObject map[string]json.RawMessage

// get decodes member name into v; a missing member leaves v alone.
func (o rawObject) get(name string, v any) error {
	if raw, ok := o[name]; ok {
		if err := json.Unmarshal(raw, v); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// set encodes v as member name.
func (o rawObject) set(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	o[name] = b
	return nil
}

// has reports whether member name is there and not null.
func (o rawObject) has(name string) bool {
	raw, ok := o[name]
	return ok && string(raw) != "null"
}

// decodeBundleSpec decodes what the agent needs of a spec.
func decodeBundleSpec(data []byte) (*bundleSpec, error) {
	s := &bundleSpec{}
	if err := json.Unmarshal(data, &s.doc); err != nil {
		return nil, err
	}
	if s.doc == nil {
		return nil, fmt.Errorf("the spec is not a JSON object")
	}
	top := rawObject(s.doc)
	if err := top.get("ociVersion", &s.Version); err != nil {
		return nil, err
	}
	if err := top.get("process", &s.process); err != nil {
		return nil, err
	}
	if err := top.get("linux", &s.linux); err != nil {
		return nil, err
	}
	var root struct {
		Readonly bool `json:"readonly"`
	}
	if err := top.get("root", &root); err != nil {
		return nil, err
	}
	s.ReadonlyRoot = root.Readonly
	if s.process != nil {
		if err := s.process.get("terminal", &s.Terminal); err != nil {
			return nil, fmt.Errorf("process.%w", err)
		}
		if err := s.process.get("args", &s.Args); err != nil {
			return nil, fmt.Errorf("process.%w", err)
		}
	}
	if s.linux != nil {
		if err := s.linux.get("cgroupsPath", &s.CgroupsPath); err != nil {
			return nil, fmt.Errorf("linux.%w", err)
		}
	}
	return s, nil
}

// mountDestinations are the destinations of the spec's mounts.
func (s *bundleSpec) mountDestinations() ([]string, error) {
	var mounts []struct {
		Destination string `json:"destination"`
	}
	if err := rawObject(s.doc).get("mounts", &mounts); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(mounts))
	for _, m := range mounts {
		out = append(out, m.Destination)
	}
	return out, nil
}

// bindMount is a bind mount of a spec, as the agent reads it.
type bindMount struct {
	Destination string
	Source      string
}

// bindMounts are the spec's bind mounts: type "bind", or a "bind" or
// "rbind" option (with type "none" or none at all), as the OCI runtime
// takes them.
func (s *bundleSpec) bindMounts() ([]bindMount, error) {
	var mounts []struct {
		Destination string   `json:"destination"`
		Type        string   `json:"type"`
		Source      string   `json:"source"`
		Options     []string `json:"options"`
	}
	if err := rawObject(s.doc).get("mounts", &mounts); err != nil {
		return nil, err
	}
	var out []bindMount
	for _, m := range mounts {
		if m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind") {
			out = append(out, bindMount{Destination: m.Destination, Source: m.Source})
		}
	}
	return out, nil
}

// marshal encodes the spec with root.path set to root (readonly as the
// host asked), and the decoded fields the agent may have changed.
func (s *bundleSpec) marshal(root string) ([]byte, error) {
	top := rawObject(s.doc)
	if err := top.set("root", map[string]any{"path": root, "readonly": s.ReadonlyRoot}); err != nil {
		return nil, err
	}
	if err := top.set("ociVersion", s.Version); err != nil {
		return nil, err
	}
	if s.process != nil {
		if err := top.set("process", s.process); err != nil {
			return nil, err
		}
	}
	if s.linux != nil {
		if err := s.linux.set("cgroupsPath", s.CgroupsPath); err != nil {
			return nil, err
		}
		if err := top.set("linux", s.linux); err != nil {
			return nil, err
		}
	}
	return json.Marshal(s.doc)
}

// downlevel makes a spec of runtime-spec 1.2 or later readable by a 1.1
// runtime. Those versions only add things a container may ask for; a spec
// that asks for none of them means the same under 1.1, and gets
// ociVersion 1.1.0. One that asks for one is refused, naming it, rather
// than run without it. Relative mount destinations (1.2) are made
// absolute, which is what they mean. A spec of 1.1 or earlier is left
// alone; a major version other than 1 is refused.
func (s *bundleSpec) downlevel(id string) error {
	newer, err := newerThanRuntime(s.Version)
	if err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	if !newer {
		return nil
	}
	unsupported := processAdditions(s.process)
	var mounts []rawObject
	if err := rawObject(s.doc).get("mounts", &mounts); err != nil {
		return fmt.Errorf("container %s: %w: %v", id, errdefs.ErrInvalidArgument, err)
	}
	rewritten := false
	for _, m := range mounts {
		var dest string
		var options []string
		if err := m.get("destination", &dest); err != nil {
			return fmt.Errorf("container %s: mounts: %w: %v", id, errdefs.ErrInvalidArgument, err)
		}
		if err := m.get("options", &options); err != nil {
			return fmt.Errorf("container %s: mounts: %w: %v", id, errdefs.ErrInvalidArgument, err)
		}
		if dest != "" && !path.IsAbs(dest) {
			dest = path.Join("/", dest)
			if err := m.set("destination", dest); err != nil {
				return err
			}
			rewritten = true
		}
		for _, o := range []string{"idmap", "ridmap"} {
			if slices.Contains(options, o) {
				unsupported = append(unsupported, fmt.Sprintf("mounts[%s].options %s (idmapped mounts)", dest, o))
			}
		}
	}
	if l := s.linux; l != nil {
		if l.has("memoryPolicy") {
			unsupported = append(unsupported, "linux.memoryPolicy")
		}
		if l.has("netDevices") {
			unsupported = append(unsupported, "linux.netDevices")
		}
		var rdt struct {
			Schemata         []string `json:"schemata"`
			EnableMonitoring bool     `json:"enableMonitoring"`
		}
		if err := l.get("intelRdt", &rdt); err != nil {
			return fmt.Errorf("container %s: linux.%w: %v", id, errdefs.ErrInvalidArgument, err)
		}
		if len(rdt.Schemata) > 0 || rdt.EnableMonitoring {
			unsupported = append(unsupported, "linux.intelRdt.schemata and enableMonitoring")
		}
	}
	if len(unsupported) > 0 {
		return fmt.Errorf("container %s: the guest's OCI runtime reads runtime-spec %s; this %s spec asks for what came later: %s: %w",
			id, runtimeSpecVersion, s.Version, strings.Join(unsupported, ", "), errdefs.ErrNotImplemented)
	}
	if rewritten {
		if err := rawObject(s.doc).set("mounts", mounts); err != nil {
			return err
		}
	}
	s.Version = runtimeSpecVersion
	return nil
}

// processAdditions lists what a process asks for that runtime-spec 1.1
// lacks. An exec's process carries no version of its own, so it is
// checked always.
func processAdditions(p rawObject) []string {
	if p.has("execCPUAffinity") {
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
