package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	taskv2 "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
)

// shortDir is a temporary directory with a short path: unix socket paths
// are limited to 108 bytes.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "cs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// podBundle writes a bundle whose spec makes the container join sandbox
// pod1.
func podBundle(t *testing.T) string {
	t.Helper()
	b := t.TempDir()
	spec := map[string]any{"annotations": map[string]string{
		"io.kubernetes.cri.container-type": "container",
		"io.kubernetes.cri.sandbox-id":     "pod1",
	}}
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(b, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

func testConfig(t *testing.T) func(string) string {
	t.Helper()
	root := t.TempDir()
	cfg := filepath.Join(root, "config.toml")
	if err := os.WriteFile(cfg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return env("COCOON_CONFIG", cfg, "COCOON_STATE_DIR", filepath.Join(root, "run"))
}

// TestStartJoinsSandboxShim: a pod's container gets the address of the
// pod's running shim (no new shim), in the caller's protocol, and start
// saves what delete needs first.
func TestStartJoinsSandboxShim(t *testing.T) {
	sockDir := shortDir(t)
	bundle := podBundle(t)
	getenv := testConfig(t)
	grpc := "/run/containerd/containerd.sock"
	address, err := socketAddress(sockDir, grpc, "k8s.io", "pod1")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", socketPath(address))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	params, _ := proto.Marshal(&bootapi.BootstrapParams{InstanceID: "app", Namespace: "k8s.io", ContainerdGrpcAddress: grpc, SocketDir: &sockDir})
	var out bytes.Buffer
	err = Run(context.Background(), Env{
		Args:   []string{"-namespace", "k8s.io", "-id", "app", "-address", grpc, "-bundle", bundle, "start"},
		Stdin:  bytes.NewReader(params),
		Stdout: &out,
		Getenv: getenv,
	})
	if err != nil {
		t.Fatal(err)
	}
	if a, v, err := parse24(out.Bytes()); err != nil || a != address || v != 3 {
		t.Errorf("answer: %q v%d %v, want %s", a, v, err, address)
	}
	st, err := readBundleState(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if st.SandboxID != "pod1" || st.Address != address || !strings.HasSuffix(st.SandboxDir, "/run/k8s.io/pod1") {
		t.Errorf("bundle state = %+v", st)
	}
	if b, _ := os.ReadFile(filepath.Join(bundle, "address")); string(b) != address {
		t.Errorf("address file = %q", b)
	}
}

// TestStartJoinsDeadSandbox: joining a pod whose shim is gone is refused.
func TestStartJoinsDeadSandbox(t *testing.T) {
	err := Run(context.Background(), Env{
		Args:   []string{"-namespace", "k8s.io", "-id", "app", "-address", "/x.sock", "-bundle", podBundle(t), "start"},
		Stdin:  bytes.NewReader(nil),
		Stdout: &bytes.Buffer{},
		Getenv: testConfig(t),
	})
	if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("got %v, want failed precondition", err)
	}
}

// TestDeleteAfterDeadShim: delete removes the dead sandbox's state and
// answers a DeleteResponse that containerd 1.6's v2 types decode; a live
// shim's state is left alone.
func TestDeleteAfterDeadShim(t *testing.T) {
	for _, alive := range []bool{false, true} {
		sockDir := shortDir(t)
		bundle := t.TempDir()
		sandboxDir := filepath.Join(t.TempDir(), "run", "ns", "sb1")
		if err := os.MkdirAll(sandboxDir, 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(sandboxDir, "console.log"), []byte("x"), 0o600)
		address := "unix://" + filepath.Join(sockDir, "shim")
		if alive {
			l, err := net.Listen("unix", socketPath(address))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
		}
		if err := writeBundleState(bundle, bundleState{Namespace: "ns", ContainerID: "c1", SandboxID: "sb1", SandboxDir: sandboxDir, Address: address}); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err := Run(context.Background(), Env{
			Args:   []string{"-namespace", "ns", "-id", "c1", "-bundle", bundle, "delete"},
			Stdout: &out,
			Getenv: env(),
		})
		if err != nil {
			t.Fatal(err)
		}
		var resp taskv2.DeleteResponse
		if err := proto.Unmarshal(out.Bytes(), &resp); err != nil || resp.ExitStatus != 137 || resp.ExitedAt == nil {
			t.Errorf("delete response = %v, %v", &resp, err)
		}
		_, statErr := os.Stat(sandboxDir)
		if alive && statErr != nil {
			t.Error("delete removed the state of a sandbox whose shim still runs")
		}
		if !alive && !os.IsNotExist(statErr) {
			t.Errorf("sandbox state left after delete: %v", statErr)
		}
	}
}

// TestDeleteWithoutState: a bundle where start saved nothing.
func TestDeleteWithoutState(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), Env{Args: []string{"-namespace", "ns", "-id", "c1", "-bundle", t.TempDir(), "delete"}, Stdout: &out, Getenv: env()})
	if err != nil || out.Len() == 0 {
		t.Errorf("delete = %v, %d bytes", err, out.Len())
	}
}

// TestBundleStateValidate refuses a sandbox_dir that is not one.
func TestBundleStateValidate(t *testing.T) {
	for _, dir := range []string{"/", "/run/cocoon", "relative/ns/sb", "/run/cocoon/ns/other", "/run/cocoon/ns/sb/.."} {
		st := bundleState{Namespace: "ns", SandboxID: "sb", SandboxDir: dir}
		if st.validate() == nil {
			t.Errorf("sandbox_dir %q accepted", dir)
		}
	}
	if err := (bundleState{Namespace: "ns", SandboxID: "sb", SandboxDir: "/run/cocoon/ns/sb"}).validate(); err != nil {
		t.Error(err)
	}
}

// TestVersionAndInfo: -v and -info need no namespace.
func TestVersionAndInfo(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), Env{Args: []string{"-v"}, Stdout: &out}); err != nil || !strings.Contains(out.String(), RuntimeName) {
		t.Errorf("-v: %q, %v", out.String(), err)
	}
	out.Reset()
	if err := Run(context.Background(), Env{Args: []string{"-info"}, Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	var info types.RuntimeInfo
	if err := proto.Unmarshal(out.Bytes(), &info); err != nil || info.Name != RuntimeName {
		t.Errorf("-info: %v, %v", &info, err)
	}
	if err := Run(context.Background(), Env{Args: []string{"start"}, Stdout: &out}); err == nil {
		t.Error("start without -namespace accepted")
	}
}
