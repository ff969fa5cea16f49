package task

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/rootfs"
)

// The type URLs containerd gives the JSON-encoded OCI types it sends in an
// Any (containerd registers them with typeurl under these names, the same
// from 1.6 to 2.x).
var (
	specURLPrefix     = "types.containerd.io/opencontainers/runtime-spec/" + strconv.Itoa(specs.VersionMajor) + "/"
	processSpecURL    = specURLPrefix + "Process"
	linuxResourcesURL = specURLPrefix + "LinuxResources"
)

// readSpec reads the OCI spec of a bundle.
func readSpec(bundle string) (*specs.Spec, error) {
	return oci.ReadBundleSpec(bundle)
}

// decodeJSONAny decodes an Any holding one of containerd's JSON-encoded
// OCI types.
func decodeJSONAny(a *anypb.Any, url string, v any) error {
	if a == nil {
		return fmt.Errorf("%w: no %s given", errdefs.ErrInvalidArgument, filepath.Base(url))
	}
	if a.GetTypeUrl() != url {
		return fmt.Errorf("%w: got type %q, want %q", errdefs.ErrInvalidArgument, a.GetTypeUrl(), url)
	}
	if err := json.Unmarshal(a.GetValue(), v); err != nil {
		return fmt.Errorf("%w: decode %s: %v", errdefs.ErrInvalidArgument, filepath.Base(url), err)
	}
	return nil
}

// rootfsMounts turns containerd's rootfs mounts into the sandbox's. With
// none, the spec's root directory is the root, as runc takes it: root.path,
// relative to the bundle unless absolute (ctr run --rootfs gives an
// absolute one; a bundle made by hand has rootfs/).
func rootfsMounts(bundle string, ms []*types.Mount, spec *specs.Spec) []rootfs.Mount {
	if len(ms) == 0 {
		opts := []string{"rbind", "rw"}
		dir := "rootfs"
		if spec.Root != nil {
			if spec.Root.Readonly {
				opts[1] = "ro"
			}
			if spec.Root.Path != "" {
				dir = spec.Root.Path
			}
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(bundle, dir)
		}
		return []rootfs.Mount{{Type: "bind", Source: dir, Options: opts}}
	}
	out := make([]rootfs.Mount, 0, len(ms))
	for _, m := range ms {
		out = append(out, rootfs.Mount{Type: m.GetType(), Source: m.GetSource(), Options: m.GetOptions()})
	}
	return out
}
