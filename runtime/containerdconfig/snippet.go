// Package containerdconfig is Cocoon's part of containerd's
// configuration: the CRI runtime handler "cocoon". It holds the one text
// of that handler's table (which docs/containerd.md shows, `cocoon
// containerd-config` prints and `make install` puts in the installed
// docs), the edit `cocoon deploy install` makes to a node's containerd
// configuration and its exact undo (edit.go), and the reading of
// `containerd config dump` that the installer verifies its edit with and
// `cocoon check` reports (dump.go).
package containerdconfig

import (
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
)

const (
	// Handler is the CRI runtime handler: a RuntimeClass's handler, the
	// key of the runtime's table in containerd's CRI configuration.
	Handler = "cocoon"
	// RuntimeType is Cocoon's containerd runtime.
	RuntimeType = "io.containerd.cocoon.v2"
	// AnnotationPattern lets Cocoon's annotations through the CRI to the
	// shim (pod_annotations, container_annotations).
	AnnotationPattern = "io.cocoon.*"
)

// Layout is where a containerd config version keeps the CRI runtimes.
type Layout int

const (
	// LayoutV2 is containerd 1.6 and 1.7, config version 2: the runtimes
	// are in plugin io.containerd.grpc.v1.cri.
	LayoutV2 Layout = 2
	// LayoutV3 is containerd 2.x, config versions 3 and 4 (2.4's): the
	// runtimes are in plugin io.containerd.cri.v1.runtime.
	LayoutV3 Layout = 3
)

// The CRI plugins that hold the runtimes, by layout.
const (
	PluginV2 = "io.containerd.grpc.v1.cri"
	PluginV3 = "io.containerd.cri.v1.runtime"
)

// LayoutOf is the layout of a config file of that version.
func LayoutOf(version int) (Layout, error) {
	switch version {
	case 2:
		return LayoutV2, nil
	case 3, 4:
		return LayoutV3, nil
	case 0, 1:
		return 0, fmt.Errorf("containerd config version 1 (a file without a version key): %w: add `version = 2` (containerd 1.6, 1.7) or `version = 3` (2.x) at its top, or migrate it (`containerd config migrate`, 2.x)", errdefs.ErrNotImplemented)
	default:
		return 0, fmt.Errorf("containerd config version %d: %w: Cocoon knows versions 2 to 4", version, errdefs.ErrNotImplemented)
	}
}

// LayoutForContainerd is the layout of a new config for a containerd of
// that major version.
func LayoutForContainerd(major int) (Layout, error) {
	switch {
	case major == 1:
		return LayoutV2, nil
	case major >= 2:
		return LayoutV3, nil
	default:
		return 0, fmt.Errorf("containerd major version %d: %w", major, errdefs.ErrInvalidArgument)
	}
}

// Plugin is the CRI plugin that holds the runtimes in this layout.
func (l Layout) Plugin() string {
	if l == LayoutV2 {
		return PluginV2
	}
	return PluginV3
}

// Version is the config version a file of this layout declares: the
// lowest that has it, which every containerd of the layout reads (2.4
// migrates a version 3 file to its 4).
func (l Layout) Version() int { return int(l) }

// Tables is the handler's runtime table in this layout: what a config
// file holds of Cocoon, without the version line.
func Tables(l Layout) string {
	t := fmt.Sprintf("plugins.%q.containerd.runtimes.%s", l.Plugin(), Handler)
	var b strings.Builder
	fmt.Fprintf(&b, "[%s]\n", t)
	fmt.Fprintf(&b, "  runtime_type = %q\n", RuntimeType)
	b.WriteString("  # Let Cocoon's annotations through to the shim (docs/annotations.md).\n")
	fmt.Fprintf(&b, "  pod_annotations = [%q]\n", AnnotationPattern)
	fmt.Fprintf(&b, "  container_annotations = [%q]\n", AnnotationPattern)
	b.WriteString("  # A privileged pod must not get the host's devices: they are not the VM's.\n")
	b.WriteString("  privileged_without_host_devices = true\n")
	if l == LayoutV3 {
		b.WriteString("  # Keep the default sandboxer (\"podsandbox\"): Cocoon implements the Task\n")
		b.WriteString("  # API, not containerd's shim Sandbox API.\n")
	}
	b.WriteString("  # Without options the shim reads /etc/cocoon/config.toml if it exists.\n")
	b.WriteString("  # Another file for this handler (it must exist):\n")
	fmt.Fprintf(&b, "  # [%s.options]\n", t)
	b.WriteString("  #   ConfigPath = \"/etc/cocoon/other.toml\"\n")
	return b.String()
}

// Snippet is a whole config file of that version holding the handler:
// the version line and Tables.
func Snippet(version int) (string, error) {
	l, err := LayoutOf(version)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("version = %d\n\n%s", version, Tables(l)), nil
}
