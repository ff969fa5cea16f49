package task

import (
	"reflect"
	"testing"

	"github.com/containerd/containerd/api/types"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/runtime/rootfs"
)

// TestRootfsMounts: containerd's mounts pass through; without any, the
// spec's root directory is the root, as runc reads it.
func TestRootfsMounts(t *testing.T) {
	for _, tc := range []struct {
		name string
		ms   []*types.Mount
		root *specs.Root
		want []rootfs.Mount
	}{
		{"snapshot mounts", []*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/l"}}}, &specs.Root{Path: "rootfs"},
			[]rootfs.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/l"}}}},
		{"bundle's rootfs", nil, &specs.Root{Path: "rootfs"},
			[]rootfs.Mount{{Type: "bind", Source: "/b/rootfs", Options: []string{"rbind", "rw"}}}},
		{"absolute root (ctr run --rootfs)", nil, &specs.Root{Path: "/srv/root", Readonly: true},
			[]rootfs.Mount{{Type: "bind", Source: "/srv/root", Options: []string{"rbind", "ro"}}}},
		{"no root", nil, nil,
			[]rootfs.Mount{{Type: "bind", Source: "/b/rootfs", Options: []string{"rbind", "rw"}}}},
	} {
		if got := rootfsMounts("/b", tc.ms, &specs.Spec{Root: tc.root}); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
