package containerdconfig

import (
	"strings"
	"testing"
)

// TestParseDump reads dumps as containerd 1.x (double quotes, the CRI in
// io.containerd.grpc.v1.cri) and 2.x (single quotes, the runtimes in
// io.containerd.cri.v1.runtime) print them, and what keeps a handler
// from working.
func TestParseDump(t *testing.T) {
	const v2 = `version = 2
disabled_plugins = []

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.6"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.cocoon]
          pod_annotations = ["io.cocoon.*"]
          container_annotations = ["io.cocoon.*"]
          privileged_without_host_devices = true
          runtime_type = "io.containerd.cocoon.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.cocoon.options]
            ConfigPath = "/etc/cocoon/other.toml"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/opt/containerd"
`
	const v4 = `version = 4
disabled_plugins = []

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.cocoon]
          runtime_type = 'io.containerd.cocoon.v2'
          pod_annotations = []
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
`
	h, err := ParseDump([]byte(v2), Handler)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != 2 || h.Plugin != PluginV2 || h.Problem() != "" || h.Runtime.Options["ConfigPath"] != "/etc/cocoon/other.toml" || !h.DefaultRuntimeFound {
		t.Errorf("1.x dump: %+v, problem %q", h, h.Problem())
	}
	h, err = ParseDump([]byte(v4), Handler)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != 4 || h.Plugin != PluginV3 || !strings.Contains(h.Problem(), "pod_annotations lack") {
		t.Errorf("2.x dump: %+v, problem %q", h, h.Problem())
	}
	for _, tc := range []struct{ name, dump, problem string }{
		{"wrong type", strings.Replace(v2, `"io.containerd.cocoon.v2"`, `"io.containerd.runc.v2"`, 1), `runtime_type is "io.containerd.runc.v2"`},
		{"cri disabled", strings.Replace(v2, "disabled_plugins = []", `disabled_plugins = ["io.containerd.grpc.v1.cri"]`, 1), "the CRI plugin is disabled"},
		{"no runc", strings.Replace(v2, `runtimes.runc]`, `runtimes.kata]`, 1), `default runtime "runc"`},
	} {
		h, err := ParseDump([]byte(tc.dump), Handler)
		if err != nil || !h.Found() || !strings.Contains(h.Problem(), tc.problem) {
			t.Errorf("%s: %+v, problem %q, err %v; want a problem with %q", tc.name, h, h.Problem(), err, tc.problem)
		}
	}
	if h, err := ParseDump([]byte(v2), "kata"); err != nil || h.Found() {
		t.Errorf("handler kata: %+v, %v; want not found", h, err)
	}
	if _, err := ParseDump([]byte("version = [\n"), Handler); err == nil {
		t.Error("a dump that is not TOML parsed")
	}
}

func TestParseVersion(t *testing.T) {
	for out, want := range map[string][2]int{
		"containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n": {1, 6},
		"containerd github.com/containerd/containerd v1.7.30 \n":                        {1, 7},
		"containerd github.com/containerd/containerd/v2 v2.4.2 \n":                      {2, 4},
	} {
		major, minor, err := ParseVersion(out)
		if err != nil || [2]int{major, minor} != want {
			t.Errorf("ParseVersion(%q) = %d.%d, %v; want %v", out, major, minor, err, want)
		}
	}
	if _, _, err := ParseVersion("containerd: command not found"); err == nil {
		t.Error("ParseVersion found a version in an error")
	}
}
