// The manifests of this directory, read with Kubernetes' own types: what
// the RuntimeClass schedules on, and what the DaemonSet gives the
// installer, checked against the code that installs (runtime/deploy)
// and the handler containerd is given (runtime/containerdconfig).
package kubernetes

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/containerdconfig"
	"github.com/cocoonrt/cocoon/runtime/deploy"
)

// documents splits a manifest file into its YAML documents, each decoded
// strictly (an unknown field is an error) into the type its kind names.
func documents(t *testing.T, name string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]any{}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var obj any
		switch meta.APIVersion + " " + meta.Kind {
		case "v1 Namespace":
			obj = &corev1.Namespace{}
		case "v1 ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "apps/v1 DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "node.k8s.io/v1 RuntimeClass":
			obj = &nodev1.RuntimeClass{}
		default:
			t.Fatalf("%s: a %s %s, which the test does not know", name, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s: %s: %v", name, meta.Kind, err)
		}
		if _, dup := objs[meta.Kind]; dup {
			t.Fatalf("%s: two of kind %s", name, meta.Kind)
		}
		objs[meta.Kind] = obj
	}
	return objs
}

// TestRuntimeClass: the handler is the one the installer gives
// containerd, the overhead holds at least the guest's default memory,
// and the pods go to the nodes the installer labels.
func TestRuntimeClass(t *testing.T) {
	rc := documents(t, "runtimeclass.yaml")["RuntimeClass"].(*nodev1.RuntimeClass)
	if rc.Name != "cocoon" || rc.Handler != containerdconfig.Handler {
		t.Errorf("RuntimeClass %s, handler %q; want cocoon, %q", rc.Name, rc.Handler, containerdconfig.Handler)
	}
	for _, v := range []int{2, 3} {
		s, err := containerdconfig.Snippet(v)
		if err != nil {
			t.Fatal(err)
		}
		var f struct {
			Plugins map[string]struct {
				Containerd struct {
					Runtimes map[string]map[string]any `toml:"runtimes"`
				} `toml:"containerd"`
			} `toml:"plugins"`
		}
		if _, err := toml.Decode(s, &f); err != nil {
			t.Fatal(err)
		}
		l, _ := containerdconfig.LayoutOf(v)
		if _, ok := f.Plugins[l.Plugin()].Containerd.Runtimes[rc.Handler]; !ok {
			t.Errorf("the version %d snippet has no runtime %q in %s", v, rc.Handler, l.Plugin())
		}
	}
	if rc.Overhead == nil {
		t.Fatal("no overhead")
	}
	mem, cpu := rc.Overhead.PodFixed[corev1.ResourceMemory], rc.Overhead.PodFixed[corev1.ResourceCPU]
	guest := resource.NewQuantity(int64(config.Default().Hypervisor.MemoryMiB)<<20, resource.BinarySI)
	if mem.Cmp(*guest) < 0 {
		t.Errorf("overhead memory %s is less than the guest's default memory %s", mem.String(), guest.String())
	}
	if cpu.IsZero() {
		t.Errorf("overhead cpu %s", cpu.String())
	}
	if rc.Scheduling == nil || len(rc.Scheduling.NodeSelector) != 1 || rc.Scheduling.NodeSelector[deploy.NodeLabel] != deploy.NodeLabelValue {
		t.Errorf("scheduling %+v, want nodeSelector %s: %q, the installer's label", rc.Scheduling, deploy.NodeLabel, deploy.NodeLabelValue)
	}
}

// TestDeploy: the DaemonSet runs `cocoon deploy run` privileged, with
// the host's PID namespace its nsenter needs, each host directory the
// installer writes under mounted at the same path under its host root,
// and a service account whose one permission is to patch nodes.
func TestDeploy(t *testing.T) {
	objs := documents(t, "cocoon-deploy.yaml")
	ns := objs["Namespace"].(*corev1.Namespace)
	sa := objs["ServiceAccount"].(*corev1.ServiceAccount)
	role := objs["ClusterRole"].(*rbacv1.ClusterRole)
	binding := objs["ClusterRoleBinding"].(*rbacv1.ClusterRoleBinding)
	ds := objs["DaemonSet"].(*appsv1.DaemonSet)
	if sa.Namespace != ns.Name || ds.Namespace != ns.Name {
		t.Errorf("namespaces: service account %q, DaemonSet %q, want %q", sa.Namespace, ds.Namespace, ns.Name)
	}

	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"patch"}}}
	if !equalJSON(t, role.Rules, want) {
		t.Errorf("ClusterRole rules %+v, want only %+v", role.Rules, want)
	}
	if binding.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}) ||
		!equalJSON(t, binding.Subjects, []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}}) {
		t.Errorf("ClusterRoleBinding %+v %+v does not bind %s to %s/%s alone", binding.RoleRef, binding.Subjects, role.Name, sa.Namespace, sa.Name)
	}

	pod := ds.Spec.Template.Spec
	if pod.ServiceAccountName != sa.Name || !pod.HostPID {
		t.Errorf("pod: service account %q, hostPID %v; want %q, true", pod.ServiceAccountName, pod.HostPID, sa.Name)
	}
	sel := ds.Spec.Selector.MatchLabels
	for k, v := range sel {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("the selector's %s=%s is not the pod's label", k, v)
		}
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the installer is not privileged")
	}
	// SIGTERM to `deploy run` uninstalls: the command, not a preStop
	// hook, which would run through the containerd it restarts.
	if !slices.Equal(c.Command[1:], []string{"deploy", "run"}) || c.Lifecycle != nil {
		t.Errorf("command %q, lifecycle %+v; want `cocoon deploy run`, which uninstalls on SIGTERM", c.Command, c.Lifecycle)
	}
	if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds < 100+10 {
		t.Errorf("terminationGracePeriodSeconds %v: the uninstall may take 100 s", pod.TerminationGracePeriodSeconds)
	}
	flags := map[string]string{}
	for _, a := range c.Args {
		k, v, _ := strings.Cut(a, "=")
		flags[k] = v
	}
	root := flags["--host-root"]
	if root == "" || root == "/" || flags["--payload"] == "" {
		t.Fatalf("args %q: want --host-root and --payload", c.Args)
	}
	checkImage(t, c.Command[0], flags["--payload"])
	if _, ok := flags["--nsenter"]; !ok {
		t.Errorf("args %q: without --nsenter containerd and systemctl are the image's, not the host's", c.Args)
	}
	env := map[string]*corev1.EnvVarSource{}
	for _, e := range c.Env {
		env[e.Name] = e.ValueFrom
	}
	if src := env["NODE_NAME"]; src == nil || src.FieldRef == nil || src.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME is not the pod's node: %+v", src)
	}

	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	for _, dir := range deploy.HostDirs() {
		m, ok := mounts[filepath.Join(root, dir)]
		if !ok || m.ReadOnly {
			t.Errorf("%s is not mounted writable at %s", dir, filepath.Join(root, dir))
			continue
		}
		if v := volumes[m.Name]; v.HostPath == nil || v.HostPath.Path != dir {
			t.Errorf("%s: volume %s is %+v, want hostPath %s", m.MountPath, m.Name, v.VolumeSource, dir)
		}
	}
	if cfg := flags["--cocoon-config"]; cfg != "" {
		m, ok := mounts[filepath.Dir(cfg)]
		if v := volumes[m.Name]; !ok || v.ConfigMap == nil || v.ConfigMap.Optional == nil || !*v.ConfigMap.Optional {
			t.Errorf("--cocoon-config %s is not in an optional ConfigMap's volume", cfg)
		}
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil && !slices.Contains(deploy.HostDirs(), v.HostPath.Path) {
			t.Errorf("hostPath %s: the installer does not write there", v.HostPath.Path)
		}
	}
}

// checkImage checks that deploy/Containerfile puts make install's
// /usr/local where the DaemonSet's payload is, and the cocoon command in
// it.
func checkImage(t *testing.T, command, payload string) {
	t.Helper()
	data, err := os.ReadFile("../Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	var copied, entry string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "COPY" && f[1] == "usr/local/" {
			copied = f[2]
		}
		if rest, ok := strings.CutPrefix(line, "ENTRYPOINT "); ok {
			var argv []string
			if err := yaml.Unmarshal([]byte(rest), &argv); err == nil && len(argv) > 0 {
				entry = argv[0]
			}
		}
	}
	if copied != payload+"/usr/local/" || entry != command || command != payload+"/usr/local/bin/cocoon" {
		t.Errorf("deploy/Containerfile copies usr/local/ to %q and runs %q; the DaemonSet runs %q with payload %q", copied, entry, command, payload)
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := yaml.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := yaml.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}
