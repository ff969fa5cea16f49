package rootfs

import (
	"reflect"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestPolicyFor(t *testing.T) {
	// containerd's default capabilities (oci.WithDefaultSpec).
	defaults := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}
	spec := func(user specs.User, caps []string, userns bool) *specs.Spec {
		s := &specs.Spec{Process: &specs.Process{User: user, Capabilities: &specs.LinuxCapabilities{Bounding: caps}}, Linux: &specs.Linux{}}
		if userns {
			s.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.UserNamespace}}
			s.Linux.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}}
			s.Linux.GIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: 200000, Size: 1000}}
		}
		return s
	}
	for _, tc := range []struct {
		name string
		spec *specs.Spec
		want Policy
	}{
		{"containerd's defaults", spec(specs.User{}, defaults, false),
			Policy{Mknod: true, SetFcap: true, AnySetuid: true, AnySetgid: true, HasUID: true, GIDs: []uint32{0}}},
		{"all dropped, a user", spec(specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{27}}, nil, false),
			Policy{UID: 1000, HasUID: true, GIDs: []uint32{1000, 27}}},
		{"user namespace", spec(specs.User{UID: 5, GID: 7, AdditionalGids: []uint32{5000}}, defaults, true),
			Policy{SetFcap: true, AnySetuid: true, AnySetgid: true, UID: 100005, HasUID: true, GIDs: []uint32{200007},
				UserNS: true, UIDMap: []IDRange{{100000, 65536}}, GIDMap: []IDRange{{200000, 1000}}}},
		{"user outside the mapping", spec(specs.User{UID: 70000}, nil, true),
			Policy{GIDs: []uint32{200000}, UserNS: true, UIDMap: []IDRange{{100000, 65536}}, GIDMap: []IDRange{{200000, 1000}}}},
		{"no spec", nil, Policy{HasUID: true, GIDs: []uint32{0}}},
	} {
		if got := PolicyFor(tc.spec); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
	// A capability in any set counts.
	s := spec(specs.User{}, nil, false)
	s.Process.Capabilities.Ambient = []string{"CAP_MKNOD"}
	if !PolicyFor(s).Mknod {
		t.Error("CAP_MKNOD in the ambient set does not allow device nodes")
	}
}
