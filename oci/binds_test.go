package oci

import (
	"reflect"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestGuestSpecBinds(t *testing.T) {
	host := hostSpec()
	host.Mounts = append(host.Mounts,
		specs.Mount{Destination: "/data", Type: "bind", Source: "/srv/data/", Options: []string{"rbind", "rw"}},
		specs.Mount{Destination: "/etc/resolv.conf", Type: "none", Source: "/var/lib/x/resolv.conf", Options: []string{"bind", "ro"}},
	)
	g, err := GuestSpec(host, "c1")
	if err != nil {
		t.Fatal(err)
	}
	n := len(host.Mounts)
	want := []specs.Mount{
		{Destination: "/data", Type: "bind", Source: "/run/cocoon/shared/c1/7", Options: []string{"rbind", "rw"}},
		{Destination: "/etc/resolv.conf", Type: "bind", Source: "/run/cocoon/shared/c1/8", Options: []string{"bind", "ro"}},
	}
	if !reflect.DeepEqual(g.Mounts[n-2:], want) {
		t.Errorf("guest binds %+v, want %+v", g.Mounts[n-2:], want)
	}
	if host.Mounts[n-1].Source != "/var/lib/x/resolv.conf" {
		t.Error("GuestSpec modified the host spec's mounts")
	}
	binds := Binds(host)
	wantBinds := []Bind{
		{Index: 7, Source: "/srv/data", Destination: "/data", Recursive: true},
		{Index: 8, Source: "/var/lib/x/resolv.conf", Destination: "/etc/resolv.conf", ReadOnly: true},
	}
	if !reflect.DeepEqual(binds, wantBinds) {
		t.Errorf("Binds %+v, want %+v", binds, wantBinds)
	}
}

func TestReadOnlyLastWins(t *testing.T) {
	for _, tc := range []struct {
		opts []string
		want bool
	}{
		{nil, false}, {[]string{"ro"}, true}, {[]string{"ro", "rw"}, false}, {[]string{"rw", "nosuid", "ro"}, true},
	} {
		if got := readOnly(tc.opts); got != tc.want {
			t.Errorf("readOnly(%v) = %v", tc.opts, got)
		}
	}
}

func TestGuestSpecHostHooks(t *testing.T) {
	host := hostSpec()
	host.Hooks.CreateRuntime = []specs.Hook{{Path: "/usr/local/bin/nerdctl", Args: []string{"nerdctl", "internal", "oci-hook", "createRuntime"}}}
	host.Hooks.Poststop = []specs.Hook{{Path: "/usr/local/bin/nerdctl"}}
	host.Hooks.Prestart = []specs.Hook{{Path: "/usr/bin/dockerd"}} //nolint:staticcheck // deprecated, still written by Docker
	g, err := GuestSpec(host, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Hooks.StartContainer) != 1 || len(g.Hooks.CreateRuntime)+len(g.Hooks.Poststop)+len(g.Hooks.Prestart) != 0 { //nolint:staticcheck
		t.Errorf("guest hooks %+v: want startContainer only", g.Hooks)
	}
	for _, ns := range g.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			t.Error("a spec with host hooks and a new network namespace kept its namespace in the guest: the VM mirrors the one the shim makes")
		}
	}
	if path, create := HostNetwork(host); path != "" || !create {
		t.Errorf("HostNetwork = %q, %v; want a new one", path, create)
	}
	if path, create := HostNetwork(hostSpec()); path != "" || create {
		t.Errorf("no hooks: HostNetwork = %q, %v; want none", path, create)
	}
	joined := hostSpec()
	setNSPath(joined, specs.NetworkNamespace, "/var/run/netns/x")
	if path, create := HostNetwork(joined); path != "/var/run/netns/x" || create {
		t.Errorf("joined: HostNetwork = %q, %v", path, create)
	}
}

// TestLateNetwork: Docker 26 and later give a container a new network
// namespace, no hook, and binds of their own /etc/hosts, /etc/hostname
// and /etc/resolv.conf; they fill the namespace after the task's Create.
func TestLateNetwork(t *testing.T) {
	docker := func() *specs.Spec {
		s := hostSpec()
		for _, f := range []string{"resolv.conf", "hostname", "hosts"} {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/" + f, Type: "bind", Source: "/var/lib/docker/containers/0123/" + f, Options: []string{"rbind", "rprivate"}})
		}
		return s
	}
	if !LateNetwork(docker()) {
		t.Error("Docker's spec: LateNetwork = false")
	}
	if path, create := HostNetwork(docker()); path != "" || !create {
		t.Errorf("Docker's spec: HostNetwork = %q, %v; want a new one", path, create)
	}
	g, err := GuestSpec(docker(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range g.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			t.Error("Docker's spec kept its network namespace in the guest: the VM mirrors the one the shim makes")
		}
	}

	for name, s := range map[string]*specs.Spec{
		"ctr run (no binds)": hostSpec(),
		"a bind elsewhere": func() *specs.Spec {
			s := hostSpec()
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/app/hosts", Type: "bind", Source: "/srv/hosts"})
			return s
		}(),
		"hooks fill it at create (nerdctl)": func() *specs.Spec {
			s := docker()
			s.Hooks = &specs.Hooks{CreateRuntime: []specs.Hook{{Path: "/usr/local/bin/nerdctl"}}}
			return s
		}(),
		"a namespace to join (CRI)": func() *specs.Spec {
			s := docker()
			setNSPath(s, specs.NetworkNamespace, "/var/run/netns/x")
			return s
		}(),
		"no network namespace (--net=host)": func() *specs.Spec {
			s := docker()
			s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.NetworkNamespace })
			return s
		}(),
	} {
		if LateNetwork(s) {
			t.Errorf("%s: LateNetwork = true", name)
		}
	}
}
