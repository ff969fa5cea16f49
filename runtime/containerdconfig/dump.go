package containerdconfig

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"

	"github.com/BurntSushi/toml"
	"github.com/containerd/errdefs"
)

// Runtime is a CRI runtime's table as `containerd config dump` prints it,
// as far as Cocoon's handler needs it.
type Runtime struct {
	// RuntimeType is the containerd runtime the handler runs.
	RuntimeType string `toml:"runtime_type"`
	// PodAnnotations and ContainerAnnotations are the annotations CRI
	// passes to the runtime.
	PodAnnotations       []string `toml:"pod_annotations"`
	ContainerAnnotations []string `toml:"container_annotations"`
	// PrivilegedWithoutHostDevices keeps the host's devices from
	// privileged pods.
	PrivilegedWithoutHostDevices bool `toml:"privileged_without_host_devices"`
	// Options are the runtime's options (ConfigPath).
	Options map[string]any `toml:"options"`
}

// DumpHandler is what a config dump says of a CRI runtime handler.
type DumpHandler struct {
	// Version is the dump's config version (containerd 1.x: 2; 2.4: 4).
	Version int
	// CRIDisabled is the disabled_plugins entry that disables the CRI,
	// if one does.
	CRIDisabled string
	// Plugin is the CRI plugin whose runtimes hold the handler; empty
	// when none does.
	Plugin string
	// Runtime is the handler's table, when Plugin is set.
	Runtime Runtime
	// DefaultRuntime is the CRI plugin's default_runtime_name, and
	// DefaultRuntimeFound whether its runtimes have it: the CRI plugin
	// does not start without it.
	DefaultRuntime      string
	DefaultRuntimeFound bool
}

// Found says whether the dump has the handler.
func (h DumpHandler) Found() bool { return h.Plugin != "" }

// Problem says what keeps a found handler from serving Cocoon's pods as
// Tables sets it up; "" when nothing.
func (h DumpHandler) Problem() string {
	switch {
	case h.CRIDisabled != "":
		return fmt.Sprintf("the CRI plugin is disabled (disabled_plugins has %q)", h.CRIDisabled)
	case h.DefaultRuntime != "" && !h.DefaultRuntimeFound:
		return fmt.Sprintf("the default runtime %q (default_runtime_name) is not among the runtimes: the CRI plugin does not start", h.DefaultRuntime)
	case h.Runtime.RuntimeType != RuntimeType:
		return fmt.Sprintf("its runtime_type is %q, not %q", h.Runtime.RuntimeType, RuntimeType)
	case !slices.Contains(h.Runtime.PodAnnotations, AnnotationPattern):
		return fmt.Sprintf("its pod_annotations lack %q: pods' io.cocoon.* annotations do not reach the shim", AnnotationPattern)
	}
	return ""
}

// dumpFile is the part of a config dump ParseDump reads: plugins are
// decoded one at a time, the CRI's only.
type dumpFile struct {
	Version         int                       `toml:"version"`
	DisabledPlugins []string                  `toml:"disabled_plugins"`
	Plugins         map[string]toml.Primitive `toml:"plugins"`
}

type criPlugin struct {
	Containerd struct {
		DefaultRuntimeName string             `toml:"default_runtime_name"`
		Runtimes           map[string]Runtime `toml:"runtimes"`
	} `toml:"containerd"`
}

// ParseDump reads what the output of `containerd config dump` says of
// the handler. containerd 1.6 and 1.7 keep the runtimes in
// io.containerd.grpc.v1.cri, 2.x in io.containerd.cri.v1.runtime (its
// dump is the migrated configuration, whatever version the file has).
func ParseDump(dump []byte, handler string) (DumpHandler, error) {
	var d dumpFile
	md, err := toml.Decode(string(dump), &d)
	if err != nil {
		return DumpHandler{}, fmt.Errorf("containerd config dump: %w: %v", errdefs.ErrInvalidArgument, err)
	}
	h := DumpHandler{Version: d.Version}
	for _, p := range d.DisabledPlugins {
		if p == "cri" || p == PluginV2 || p == PluginV3 {
			h.CRIDisabled = p
		}
	}
	for _, name := range []string{PluginV3, PluginV2} {
		prim, ok := d.Plugins[name]
		if !ok {
			continue
		}
		var p criPlugin
		if err := md.PrimitiveDecode(prim, &p); err != nil {
			return DumpHandler{}, fmt.Errorf("containerd config dump: plugin %s: %w: %v", name, errdefs.ErrInvalidArgument, err)
		}
		if def := p.Containerd.DefaultRuntimeName; def != "" {
			h.DefaultRuntime = def
			_, h.DefaultRuntimeFound = p.Containerd.Runtimes[def]
		}
		if rt, ok := p.Containerd.Runtimes[handler]; ok {
			h.Plugin, h.Runtime = name, rt
			break
		}
	}
	return h, nil
}

// containerdVersion finds the version in `containerd --version`:
// "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3",
// "containerd github.com/containerd/containerd/v2 v2.4.2 <commit>".
var containerdVersion = regexp.MustCompile(`^containerd \S+ v?(\d+)\.(\d+)`)

// ParseVersion returns the major and minor version in the output of
// `containerd --version`.
func ParseVersion(out string) (major, minor int, err error) {
	m := containerdVersion.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, fmt.Errorf("containerd --version: %w: no version in %q", errdefs.ErrInvalidArgument, out)
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return major, minor, nil
}
