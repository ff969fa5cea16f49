package rootfs

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

const snaps = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots"

func TestParseMounts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mounts []Mount
		want   plan
	}{
		{
			name: "overlay of a container on a two-layer image",
			mounts: []Mount{{Type: "overlay", Source: "overlay", Options: []string{
				"index=off", "workdir=" + snaps + "/13/work", "upperdir=" + snaps + "/13/fs",
				"lowerdir=" + snaps + "/12/fs:" + snaps + "/11/fs",
			}}},
			want: plan{lowers: []string{snaps + "/11/fs", snaps + "/12/fs"}, upper: snaps + "/13/fs"},
		},
		{
			name: "overlay of a container on a one-layer image",
			mounts: []Mount{{Type: "overlay", Source: "overlay", Options: []string{
				"workdir=" + snaps + "/2/work", "upperdir=" + snaps + "/2/fs", "lowerdir=" + snaps + "/1/fs",
			}}},
			want: plan{lowers: []string{snaps + "/1/fs"}, upper: snaps + "/2/fs"},
		},
		{
			name: "overlay view: lowerdirs only",
			mounts: []Mount{{Type: "overlay", Source: "overlay", Options: []string{
				"lowerdir=/a:/b/", "index=off", "volatile",
			}}},
			want: plan{lowers: []string{"/b", "/a"}, readOnly: true},
		},
		{
			name: "overlay with ro drops the upperdir",
			mounts: []Mount{{Type: "overlay", Options: []string{
				"ro", "upperdir=/u", "workdir=/w", "lowerdir=/l", "redirect_dir=off", "metacopy=off", "nosuid",
			}}},
			want: plan{lowers: []string{"/l"}, readOnly: true},
		},
		{
			name:   "escaped colon in a lowerdir",
			mounts: []Mount{{Type: "overlay", Options: []string{`lowerdir=/a\:b:/c`}}},
			want:   plan{lowers: []string{"/c", "/a:b"}, readOnly: true},
		},
		{
			name:   "read-only bind of one snapshot",
			mounts: []Mount{{Type: "bind", Source: snaps + "/1/fs", Options: []string{"ro", "rbind"}}},
			want:   plan{lowers: []string{snaps + "/1/fs"}, readOnly: true},
		},
		{
			name:   "writable bind (native snapshotter, ctr run --rootfs)",
			mounts: []Mount{{Type: "bind", Source: "/srv/rootfs/", Options: []string{"rbind", "rw"}}},
			want:   plan{lowers: []string{"/srv/rootfs"}, rootFrom: "/srv/rootfs"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMounts(tc.mounts)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.lowers, tc.want.lowers) || got.upper != tc.want.upper ||
				got.rootFrom != tc.want.rootFrom || got.readOnly != tc.want.readOnly {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseMountsErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mounts []Mount
		is     error
		names  string // the error must quote this
	}{
		{"no mounts", nil, errdefs.ErrInvalidArgument, "no rootfs mount"},
		{"two mounts", []Mount{{Type: "bind", Source: "/a"}, {Type: "bind", Source: "/b"}}, errdefs.ErrNotImplemented, "bind /b"},
		{"unknown type", []Mount{{Type: "zfs", Source: "tank/x"}}, errdefs.ErrNotImplemented, `"zfs"`},
		{"erofs snapshotter mount", []Mount{{Type: "erofs", Source: "/l.erofs"}}, errdefs.ErrNotImplemented, `"erofs"`},
		{"overlay without lowerdir", []Mount{{Type: "overlay", Options: []string{"upperdir=/u", "workdir=/w"}}}, errdefs.ErrInvalidArgument, "no lowerdir"},
		{"empty lowerdir", []Mount{{Type: "overlay", Options: []string{"lowerdir="}}}, errdefs.ErrInvalidArgument, `""`},
		{"empty layer in lowerdir", []Mount{{Type: "overlay", Options: []string{"lowerdir=/a::/b"}}}, errdefs.ErrInvalidArgument, "lowerdir"},
		{"relative lowerdir", []Mount{{Type: "overlay", Options: []string{"lowerdir=snapshots/1/fs"}}}, errdefs.ErrInvalidArgument, `"snapshots/1/fs"`},
		{"relative upperdir", []Mount{{Type: "overlay", Options: []string{"lowerdir=/l", "upperdir=u"}}}, errdefs.ErrInvalidArgument, "upperdir"},
		{"userxattr", []Mount{{Type: "overlay", Options: []string{"lowerdir=/l", "userxattr"}}}, errdefs.ErrNotImplemented, `"userxattr"`},
		{"metacopy on", []Mount{{Type: "overlay", Options: []string{"lowerdir=/l", "metacopy=on"}}}, errdefs.ErrNotImplemented, `"metacopy=on"`},
		{"unknown overlay option", []Mount{{Type: "overlay", Options: []string{"lowerdir=/l", "frobnicate=1"}}}, errdefs.ErrNotImplemented, `"frobnicate=1"`},
		{"relative bind", []Mount{{Type: "bind", Source: "rootfs"}}, errdefs.ErrInvalidArgument, `"rootfs"`},
		{"unknown bind option", []Mount{{Type: "bind", Source: "/r", Options: []string{"rbind", "idmap=1"}}}, errdefs.ErrNotImplemented, `"idmap=1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseMounts(tc.mounts)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("err = %v, want %v naming %s", err, tc.is, tc.names)
			}
		})
	}
}
