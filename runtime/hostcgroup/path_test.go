package hostcgroup

import (
	"path"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestResolve(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		// kubelet's cgroupfs driver, through containerd's CRI.
		{"/kubepods/besteffort/pod1234/abcd", "/kubepods/besteffort/pod1234/abcd"},
		{"/kubepods/pod1234/abcd", "/kubepods/pod1234/abcd"},
		// nerdctl's and ctr's.
		{"/default/abcd", "/default/abcd"},
		// Relative: from the root too.
		{"kubepods/burstable/pod1/abcd", "/kubepods/burstable/pod1/abcd"},
		// Cleaned.
		{"//a//b/./c/", "/a/b/c"},
		{"/a:b", "/a:b"},
		// kubelet's systemd driver: the slice expanded, the scope in it.
		{"kubepods-besteffort-pod1234.slice:cri-containerd:abcd",
			"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice/cri-containerd-abcd.scope"},
		{"kubepods-pod1234.slice:cri-containerd:abcd",
			"/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abcd.scope"},
		{"kubepods.slice:cri-containerd:abcd", "/kubepods.slice/cri-containerd-abcd.scope"},
		{"system.slice:docker:abcd", "/system.slice/docker-abcd.scope"},
		// runc's defaults and edge cases: no slice is system.slice, the
		// root slice is "-.slice", a unit that is a slice is itself.
		{":cocoon:abcd", "/system.slice/cocoon-abcd.scope"},
		{"-.slice:cocoon:abcd", "/cocoon-abcd.scope"},
		{"machine.slice::abcd", "/machine.slice/-abcd.scope"},
		{"kubepods.slice:x:kubepods-pod1.slice", "/kubepods.slice/kubepods-pod1.slice"},
		{"user-1000.slice:p:n", "/user.slice/user-1000.slice/p-n.scope"},
	} {
		got, err := Resolve(tc.in)
		if err != nil {
			t.Errorf("Resolve(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("Resolve(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestResolveRefuses(t *testing.T) {
	long := strings.Repeat("x", 256)
	for _, tc := range []struct{ in, says string }{
		{"", "empty"},
		{"/", "root cgroup"},
		{".", "root cgroup"},
		{"//./", "root cgroup"},
		{"/..", `".."`},
		{"..", `".."`},
		{"/kubepods/../../etc", `".."`},
		{"a/../b", `".."`},
		{"/a\x00b", "control character"},
		{"/a\nb", "control character"},
		{"/" + long, "longer than 255"},
		{"/" + strings.Repeat("a/", 2100), "longer than 4096"},
		// Not systemd's form, not a path.
		{"a:b", "neither"},
		{"a:b:c:d", "neither"},
		// systemd's form, wrong.
		{"kubepods:cri-containerd:abcd", "invalid slice name"},
		{".slice:p:n", "invalid slice name"},
		{"kubepods--besteffort.slice:p:n", "empty component"},
		{"-kubepods.slice:p:n", "empty component"},
		{"kubepods-.slice:p:n", "empty component"},
		{"kubepods.slice:p:", "no unit name"},
		{"kubepods.slice:p:..", `".."`},
		{"kubepods.slice:..:n", `".."`},
		{"-.slice:p:-.slice", "root slice"},
		{"a.slice:p:a--b.slice", "empty component"},
	} {
		got, err := Resolve(tc.in)
		if err == nil {
			t.Errorf("Resolve(%q) = %q, want an error", tc.in, got)
			continue
		}
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("Resolve(%q): %v is not an invalid argument", tc.in, err)
		}
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Resolve(%q): %q does not say %q", tc.in, err, tc.says)
		}
	}
}

func TestExpandSlice(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"-.slice", "/"},
		{"system.slice", "/system.slice"},
		{"kubepods-besteffort-pod123.slice", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice"},
		{"a-b-c-d.slice", "/a.slice/a-b.slice/a-b-c.slice/a-b-c-d.slice"},
	} {
		got, err := ExpandSlice(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ExpandSlice(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", ".slice", "a", "a.scope", "a/b.slice", "a--b.slice", "-a.slice", "a-.slice", "--.slice"} {
		if got, err := ExpandSlice(in); err == nil {
			t.Errorf("ExpandSlice(%q) = %q, want an error", in, got)
		}
	}
}

// FuzzResolve checks that whatever a spec holds, Resolve gives a clean
// absolute path below the root, or refuses it.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{
		"/kubepods/besteffort/pod1/abcd", "a/b", "/a/../b", "..", "/",
		"kubepods-besteffort-pod1.slice:cri-containerd:abcd", "-.slice:p:n", "a.slice:p:..", "a:b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := Resolve(in)
		if err != nil {
			return
		}
		if p == "/" || !strings.HasPrefix(p, "/") || path.Clean(p) != p || len(p) > maxPathLen {
			t.Fatalf("Resolve(%q) = %q: not a clean path below the root", in, p)
		}
		for _, c := range strings.Split(p[1:], "/") {
			if c == ".." || c == "." || c == "" || len(c) > nameMax {
				t.Fatalf("Resolve(%q) = %q: component %q", in, p, c)
			}
		}
	})
}
