package task

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// hookBundle writes a bundle whose spec has a hook of each host kind that
// records its state to <dir>/<kind>.json, and for failKind one that fails.
func (ts *testService) hookBundle(failKind string, annotations map[string]string) (bundle, marks string) {
	ts.t.Helper()
	bundle = ts.bundle(annotations)
	marks = ts.t.TempDir()
	hook := func(kind string) []specs.Hook {
		body := `cat > "$1/$2.json"`
		if kind == failKind {
			body = `echo "CNI said: no IP addresses left" >&2; exit 3`
		}
		return []specs.Hook{{Path: "/bin/sh", Args: []string{"sh", "-c", body, "sh", marks, kind}}}
	}
	path := filepath.Join(bundle, "config.json")
	var spec specs.Spec
	data, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(data, &spec)
	}
	if err != nil {
		ts.t.Fatal(err)
	}
	spec.Hooks = &specs.Hooks{
		CreateRuntime: hook("createRuntime"), CreateContainer: hook("createContainer"),
		Poststart: hook("poststart"), Poststop: hook("poststop"),
	}
	data, _ = json.Marshal(spec)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		ts.t.Fatal(err)
	}
	return bundle, marks
}

// hookState reads what the hook of kind got; ok is false if it did not run.
func hookState(t *testing.T, marks, kind string) (st specs.State, ok bool) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(marks, kind+".json"))
	if os.IsNotExist(err) {
		return st, false
	}
	if err == nil {
		err = json.Unmarshal(data, &st)
	}
	if err != nil {
		t.Fatalf("%s hook's state: %v", kind, err)
	}
	return st, true
}

func TestHostHooksLifecycle(t *testing.T) {
	ts := newTestService(t)
	bundle, marks := ts.hookBundle("", map[string]string{"nerdctl/name": "web"})
	if _, err := ts.svc.Create(context.Background(), &taskapi.CreateTaskRequest{ID: "c1", Bundle: bundle}); err != nil {
		t.Fatal(err)
	}
	l := ts.launcher.launches[0]
	if !l.NewNetNS || !l.HoldNetNS || l.NetNS != "" {
		t.Errorf("launch: NewNetNS %v HoldNetNS %v NetNS %q; want a namespace made and held for the hooks", l.NewNetNS, l.HoldNetNS, l.NetNS)
	}
	for _, kind := range []string{"createRuntime", "createContainer"} {
		st, ok := hookState(t, marks, kind)
		if !ok {
			t.Fatalf("%s hook did not run at create", kind)
		}
		if st.ID != "c1" || st.Pid != fakeHookPID || st.Bundle != bundle || st.Status != specs.StateCreating || st.Annotations["nerdctl/name"] != "web" {
			t.Errorf("%s state = %+v", kind, st)
		}
	}
	if _, ok := hookState(t, marks, "poststart"); ok {
		t.Fatal("poststart ran before the start")
	}
	if _, err := ts.svc.Start(context.Background(), &taskapi.StartRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if st, ok := hookState(t, marks, "poststart"); !ok || st.Status != specs.StateRunning {
		t.Fatalf("poststart: ran %v, state %+v", ok, st)
	}
	ts.launcher.sandbox(0).proc("c1").exit(0)
	ts.wait("c1", "")
	if _, ok := hookState(t, marks, "poststop"); ok {
		t.Fatal("poststop ran before the delete")
	}
	if _, err := ts.svc.Delete(context.Background(), &taskapi.DeleteRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if st, ok := hookState(t, marks, "poststop"); !ok || st.Status != specs.StateStopped || st.Pid != fakeHookPID {
		t.Fatalf("poststop: ran %v, state %+v", ok, st)
	}
}

// A failing createRuntime hook fails the create with its own output, and
// the poststop hooks undo what the others did, as runc's destroy does.
func TestHostHookFailureFailsCreate(t *testing.T) {
	ts := newTestService(t)
	bundle, marks := ts.hookBundle("createRuntime", nil)
	_, err := ts.svc.Create(context.Background(), &taskapi.CreateTaskRequest{ID: "c1", Bundle: bundle})
	if err == nil || !strings.Contains(err.Error(), "CNI said: no IP addresses left") || !strings.Contains(err.Error(), "createRuntime") {
		t.Fatalf("create: %v; want the hook's kind and output", err)
	}
	if _, ok := hookState(t, marks, "createContainer"); ok {
		t.Error("createContainer ran after createRuntime failed")
	}
	if _, ok := hookState(t, marks, "poststop"); !ok {
		t.Error("poststop did not run after the failed create")
	}
	if len(ts.launcher.sandboxes) != 0 {
		t.Error("a sandbox was left for a create whose hook failed")
	}
}

// A container that joins a sandbox already up runs its hooks at its own
// create, with the sandbox's hook pid.
func TestHostHooksOfAJoiningContainer(t *testing.T) {
	ts := newTestService(t)
	pod := map[string]string{"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": "pod1"}
	if _, err := ts.create("pod1", pod); err != nil {
		t.Fatal(err)
	}
	bundle, marks := ts.hookBundle("", map[string]string{"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": "pod1"})
	if _, err := ts.svc.Create(context.Background(), &taskapi.CreateTaskRequest{ID: "app", Bundle: bundle}); err != nil {
		t.Fatal(err)
	}
	if st, ok := hookState(t, marks, "createRuntime"); !ok || st.ID != "app" || st.Pid != fakeHookPID {
		t.Fatalf("createRuntime of the joining container: ran %v, state %+v", ok, st)
	}
	if ts.launcher.count() != 1 {
		t.Errorf("%d launches, want the pod's one", ts.launcher.count())
	}
}
