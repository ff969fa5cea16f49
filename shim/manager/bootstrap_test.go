package manager

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The parsers below are how each containerd reads `start`'s stdout,
// transcribed from its source, so that the answers are checked against
// the real rules.

// parse16 is containerd 1.6 (runtime/v2/binary.go, Start): the trimmed
// output is the address.
func parse16(out []byte) (address string, version int) {
	return strings.TrimSpace(string(out)), 2
}

// parse17 is containerd 1.7 (runtime/v2/shim.go, parseStartResponse).
func parse17(out []byte) (string, int, error) {
	var p struct {
		Version  int    `json:"version"`
		Address  string `json:"address"`
		Protocol string `json:"protocol"`
	}
	if err := json.Unmarshal(out, &p); err != nil || p.Version < 2 {
		p.Address, p.Protocol, p.Version = string(out), "ttrpc", 2
	}
	if p.Version > 2 {
		return "", 0, fmt.Errorf("unsupported shim version (%d)", p.Version)
	}
	return p.Address, p.Version, nil
}

// parse24 is containerd 2.4 (core/runtime/v2/shim.go, parseStartResponse).
func parse24(out []byte) (string, int, error) {
	var r bootapi.BootstrapResult
	if err := proto.Unmarshal(out, &r); err == nil {
		return r.Address, int(r.Version), nil
	}
	out = bytes.TrimSpace(out)
	p := &bootapi.BootstrapResult{}
	if err := json.Unmarshal(out, p); err != nil || p.Version < 2 {
		p = &bootapi.BootstrapResult{Address: string(out), Protocol: "ttrpc", Version: 2}
	}
	if p.Version > 3 {
		return "", 0, fmt.Errorf("unsupported shim version (%d)", p.Version)
	}
	return p.Address, int(p.Version), nil
}

const testAddress = "unix:///run/containerd/s/0123456789abcdef"

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func optionsAny(t *testing.T, path string) *anypb.Any {
	t.Helper()
	a, err := anypb.New(&runtimeoptions.Options{ConfigPath: path})
	if err != nil {
		t.Fatal(err)
	}
	// containerd's typeurl names types without the type.googleapis.com/ prefix.
	a.TypeUrl = "runtimeoptions.v1.Options"
	return a
}

// TestContainerd16 is containerd 1.6: no MAX_SHIM_VERSION, runtime options
// (if any) as a protobuf Any on stdin; the answer is the bare address.
func TestContainerd16(t *testing.T) {
	opts, _ := proto.Marshal(optionsAny(t, "/etc/cocoon/other.toml"))
	f := flags{namespace: "default", id: "c1", address: "/run/containerd/containerd.sock"}
	c, err := detectCaller(opts, f, env("TTRPC_ADDRESS", "/run/containerd/containerd.sock.ttrpc"))
	if err != nil {
		t.Fatal(err)
	}
	if c.protocol != protocolBare || c.options == nil || c.ttrpcAddress != "/run/containerd/containerd.sock.ttrpc" {
		t.Fatalf("caller = %+v", c)
	}
	out, _ := c.answer(testAddress)
	if a, v := parse16(out); a != testAddress || v != 2 {
		t.Errorf("containerd 1.6 reads %q (v%d)", a, v)
	}
}

// TestContainerd17 is containerd 1.7 and 2.0-2.2: MAX_SHIM_VERSION=2, JSON
// answer, version 2 (1.7 refuses more).
func TestContainerd17(t *testing.T) {
	f := flags{namespace: "k8s.io", id: "c1", address: "/run/containerd/containerd.sock"}
	c, err := detectCaller(nil, f, env("MAX_SHIM_VERSION", "2"))
	if err != nil {
		t.Fatal(err)
	}
	if c.protocol != protocolJSON || c.version != 2 {
		t.Fatalf("caller = %+v", c)
	}
	out, _ := c.answer(testAddress)
	if !json.Valid(out) {
		t.Fatalf("answer %q is not JSON", out)
	}
	for name, parse := range map[string]func([]byte) (string, int, error){"1.7": parse17, "2.4": parse24} {
		a, v, err := parse(out)
		if err != nil || a != testAddress || v != 2 {
			t.Errorf("containerd %s reads %q v%d, %v", name, a, v, err)
		}
	}
	// A containerd that could take v3 would get it.
	c, _ = detectCaller(nil, f, env("MAX_SHIM_VERSION", "5"))
	if c.version != 3 {
		t.Errorf("MAX_SHIM_VERSION=5: version %d, want 3", c.version)
	}
}

// TestContainerd24 is containerd 2.3+: BootstrapParams on stdin, protobuf
// BootstrapResult with version 3 back.
func TestContainerd24(t *testing.T) {
	dir := "/run/c/s"
	params := &bootapi.BootstrapParams{
		InstanceID:             "c1",
		Namespace:              "default",
		LogLevel:               bootapi.LogLevel_LOG_LEVEL_DEBUG,
		ContainerdVersion:      "2.4.2",
		ContainerdGrpcAddress:  "/run/containerd/containerd.sock",
		ContainerdTtrpcAddress: "/run/containerd/containerd.sock.ttrpc",
		SocketDir:              &dir,
	}
	if err := params.AddExtension(optionsAny(t, "/etc/cocoon/x.toml")); err != nil {
		t.Fatal(err)
	}
	input, _ := proto.Marshal(params)
	f := flags{namespace: "default", id: "c1"}
	c, err := detectCaller(input, f, env("MAX_SHIM_VERSION", "2", "TTRPC_ADDRESS", "/elsewhere"))
	if err != nil {
		t.Fatal(err)
	}
	if c.protocol != protocolBootstrap || c.version != 3 || !c.debug || c.socketDir != dir ||
		c.grpcAddress != params.ContainerdGrpcAddress || c.ttrpcAddress != params.ContainerdTtrpcAddress {
		t.Fatalf("caller = %+v", c)
	}
	if c.options == nil || !c.options.MessageIs(&runtimeoptions.Options{}) {
		t.Errorf("runtime options extension not found: %v", c.options)
	}
	out, _ := c.answer(testAddress)
	a, v, err := parse24(out)
	if err != nil || a != testAddress || v != 3 {
		t.Errorf("containerd 2.4 reads %q v%d, %v", a, v, err)
	}
	var r bootapi.BootstrapResult
	if err := proto.Unmarshal(out, &r); err != nil || r.Protocol != "ttrpc" {
		t.Errorf("result = %v, %v", &r, err)
	}
}

// TestOptionsAreNotBootstrapParams: legacy runtime options parse as
// BootstrapParams too (Any's type_url and value are fields 1 and 2); they
// must not be taken for them.
func TestOptionsAreNotBootstrapParams(t *testing.T) {
	opts, _ := proto.Marshal(optionsAny(t, "/c.toml"))
	var p bootapi.BootstrapParams
	if err := proto.Unmarshal(opts, &p); err != nil {
		t.Skipf("options no longer parse as params: %v", err)
	}
	f := flags{namespace: "default", id: "c1"}
	c, err := detectCaller(opts, f, env("MAX_SHIM_VERSION", "2"))
	if err != nil {
		t.Fatal(err)
	}
	if c.protocol != protocolJSON || c.options.GetTypeUrl() != "runtimeoptions.v1.Options" {
		t.Errorf("caller = %+v", c)
	}
}

// TestSocketAddress matches containerd's shim helpers (pkg/shim,
// CreateSocketAddress), so grouping finds the same socket runc's would.
func TestSocketAddress(t *testing.T) {
	got, err := socketAddress(defaultSocketDir, "/run/containerd/containerd.sock", "k8s.io", "pod1")
	if err != nil {
		t.Fatal(err)
	}
	d := sha256.Sum256([]byte(filepath.Join("/run/containerd/containerd.sock", "k8s.io", "pod1")))
	if want := fmt.Sprintf("unix:///run/containerd/s/%x", d); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	if _, err := socketAddress("/"+strings.Repeat("x", 80), "a", "b", "c"); err == nil {
		t.Error("a socket path over the limit was accepted")
	}
}
