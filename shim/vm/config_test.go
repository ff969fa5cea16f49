package vm

import (
	"os"
	"path/filepath"
	"testing"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/anypb"
)

func options(t *testing.T, o *runtimeoptions.Options) *anypb.Any {
	t.Helper()
	a, err := anypb.New(o)
	if err != nil {
		t.Fatal(err)
	}
	a.TypeUrl = "runtimeoptions.v1.Options" // as containerd's typeurl names it
	return a
}

// TestLoadConfigPrecedence: annotation > runtime options (the file they
// name) > environment > defaults.
func TestLoadConfigPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "cocoon.toml")
	if err := os.WriteFile(file, []byte("[hypervisor]\nvcpus = 2\nmemory_mib = 512\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	getenv := func(k string) string {
		return map[string]string{"COCOON_MEMORY_MIB": "384", "COCOON_CONFIG": "/nonexistent.toml"}[k]
	}
	cfg, err := LoadConfig(options(t, &runtimeoptions.Options{ConfigPath: file}), map[string]string{"io.cocoon.vcpus": "3"}, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Hypervisor.VCPUs != 3 {
		t.Errorf("vcpus = %d, want the annotation's 3", cfg.Hypervisor.VCPUs)
	}
	if cfg.Hypervisor.MemoryMiB != 384 {
		t.Errorf("memory = %d, want the environment's 384 over the file's", cfg.Hypervisor.MemoryMiB)
	}
	if got := StateDir(cfg, "ns", "sb"); got != "/run/cocoon/ns/sb" {
		t.Errorf("state dir %s", got)
	}
}

// TestConfigPath: options of another runtime are ignored; bad ones are
// invalid arguments.
func TestConfigPath(t *testing.T) {
	if p, err := ConfigPath(&anypb.Any{TypeUrl: "containerd.runc.v1.Options"}); p != "" || err != nil {
		t.Errorf("runc options: %q, %v", p, err)
	}
	if p, err := ConfigPath(nil); p != "" || err != nil {
		t.Errorf("no options: %q, %v", p, err)
	}
	for _, o := range []*runtimeoptions.Options{{ConfigPath: "relative.toml"}, {ConfigBody: []byte("x")}} {
		if _, err := ConfigPath(options(t, o)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%v: got %v, want invalid argument", o, err)
		}
	}
	_, err := LoadConfig(nil, map[string]string{"io.cocoon.bogus": "1"}, func(string) string { return "" })
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("unknown annotation: %v", err)
	}
}
