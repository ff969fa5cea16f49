//go:build linux

package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

func TestTakeNetworkSysctls(t *testing.T) {
	const inVM = `{"ociVersion":"1.1.0","process":{"args":["sh"]},"linux":{"namespaces":[{"type":"pid"},{"type":"mount"}],
		"sysctl":{"net.ipv4.ip_unprivileged_port_start":"0","net/ipv4/ping_group_range":"0 2147483647","kernel.msgmax":"8192"}}}`
	spec, err := decodeBundleSpec([]byte(inVM))
	if err != nil {
		t.Fatal(err)
	}
	taken, err := spec.takeNetworkSysctls()
	if err != nil {
		t.Fatal(err)
	}
	if len(taken) != 2 || taken["net.ipv4.ip_unprivileged_port_start"] != "0" || taken["net/ipv4/ping_group_range"] != "0 2147483647" {
		t.Fatalf("taken = %v", taken)
	}
	var left map[string]string
	if err := spec.linux.get("sysctl", &left); err != nil || len(left) != 1 || left["kernel.msgmax"] != "8192" {
		t.Fatalf("left in the spec: %v (%v)", left, err)
	}

	// A container with a network namespace of its own keeps them: the
	// OCI runtime sets them there.
	const own = `{"linux":{"namespaces":[{"type":"network"}],"sysctl":{"net.ipv4.ip_forward":"1"}}}`
	spec, err = decodeBundleSpec([]byte(own))
	if err != nil {
		t.Fatal(err)
	}
	if taken, err := spec.takeNetworkSysctls(); err != nil || taken != nil {
		t.Fatalf("own namespace: taken %v, %v", taken, err)
	}

	for _, bad := range []string{`"net.ipv4..x":"1"`, `"net.ipv4/../../kernel/x":"1"`, `"net.ipv4.x":"1\n2"`, `"net.":"1"`} {
		spec, err := decodeBundleSpec([]byte(`{"linux":{"namespaces":[],"sysctl":{` + bad + `}}}`))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := spec.takeNetworkSysctls(); err == nil {
			t.Errorf("%s: taken", bad)
		}
	}
}

func TestSetNetworkSysctls(t *testing.T) {
	proc := t.TempDir()
	dir := filepath.Join(proc, "sys", "net", "ipv4")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ip_unprivileged_port_start", "ping_group_range"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("1024"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	err := setNetworkSysctls(context.Background(), proc, "c", map[string]string{"net.ipv4.ip_unprivileged_port_start": "0", "net/ipv4/ping_group_range": "0 1"})
	if err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"ip_unprivileged_port_start": "0", "ping_group_range": "0 1"} {
		if b, _ := os.ReadFile(filepath.Join(dir, f)); string(b) != want {
			t.Errorf("%s = %q, want %q", f, b, want)
		}
	}
	// A sysctl the kernel does not have is the spec's mistake, named.
	if err := setNetworkSysctls(context.Background(), proc, "c", map[string]string{"net.ipv4.nope": "1"}); err == nil {
		t.Error("a missing sysctl was set")
	}
}
