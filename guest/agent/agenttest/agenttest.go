//go:build linux

// Package agenttest runs cocoon-agent's container service on the test
// machine itself: an OCI runtime of the host (see Runtime), a busybox root filesystem made from
// the host's static busybox, and a rootfs assembler that needs no disks.
// Tests of the agent, its host client and the sandbox use it; the disk
// path is covered in real VMs.
package agenttest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/api"
)

// Busybox is the static busybox the root filesystems are made from.
const Busybox = "/bin/busybox"

// busyboxApplets are linked in every root filesystem.
var busyboxApplets = []string{"sh", "cat", "echo", "sleep", "true", "false", "tail", "head", "ls", "id", "env", "stty", "dd", "yes", "wc"}

// NeedContainers skips the test unless it runs as root with an OCI runtime
// and a static busybox, and makes this process a child subreaper:
// container processes are grandchildren of the agent (create forks them
// and exits), reparented to it as they are to PID 1 in the guest.
func NeedContainers(t testing.TB) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("containers need root")
	}
	if _, err := Runtime(); err != nil {
		t.Skip(err.Error())
	}
	if _, err := os.Stat(Busybox); err != nil {
		t.Skip("no static busybox at " + Busybox)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("become child subreaper: %v", err)
	}
}

// RuntimeEnv names the OCI runtime binary the tests use instead of the
// default.
const RuntimeEnv = "COCOON_TEST_OCI_RUNTIME"

// Runtime finds the OCI runtime the tests run containers with: the one
// RuntimeEnv names; else crun, the runtime the guest ships, on a host with
// cgroup v2 alone, as the guest has; else runc, because crun refuses to
// run on a hybrid cgroup host. The VM tests run the guest's crun in
// every case.
func Runtime() (string, error) {
	if p := os.Getenv(RuntimeEnv); p != "" {
		return exec.LookPath(p)
	}
	name := "crun"
	if !Unified() {
		name = "runc"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", errors.New(name + " not found (apt-get install " + name + ", or set " + RuntimeEnv + ")")
	}
	return p, nil
}

// CgroupRoot is the host's cgroup v2 mount: /sys/fs/cgroup on a unified
// host, /sys/fs/cgroup/unified on a hybrid one (where the runtime puts each
// container in the v2 tree too, so cgroup.procs and cpu.stat exist there
// even though the controllers are on v1).
func CgroupRoot() string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "/sys/fs/cgroup"
	}
	return "/sys/fs/cgroup/unified"
}

// Unified reports whether the host runs cgroup v2 only, with its
// controllers (memory limits, memory.events, pids.current...).
func Unified() bool {
	return CgroupRoot() == "/sys/fs/cgroup"
}

// Config fills the container settings of an agent.Config for this host:
// its OCI runtime, private state and container directories, and, unless set,
// its cgroup v2 root and DirRootfs.
func Config(t testing.TB, cfg agent.Config) agent.Config {
	t.Helper()
	rt, err := Runtime()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Runtime = rt
	cfg.RuntimeRoot = t.TempDir()
	// Short: console socket paths live here.
	dir, err := os.MkdirTemp("", "cc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg.ContainerDir = dir
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = CgroupRoot()
	}
	if cfg.Rootfs == nil {
		cfg.Rootfs = DirRootfs{}
	}
	return cfg
}

// DirRootfs is an agent.RootfsAssembler that ignores the disks and makes
// a busybox root directory in the container's directory.
type DirRootfs struct{}

// Assemble makes dir/rootfs, which is also the writable layer that
// ExportLayer hands back. It keeps no count of writes, so that, like a
// scratch disk without one, it always reports its layer changed.
func (DirRootfs) Assemble(ctx context.Context, dir string, _ *api.Rootfs) (*agent.Mounted, error) {
	root := filepath.Join(dir, "rootfs")
	if err := MakeBusyboxRoot(root); err != nil {
		return nil, err
	}
	return &agent.Mounted{
		Root:    root,
		Release: func(context.Context) error { return nil },
		Upper:   root,
		Changed: func() (bool, error) { return true, nil },
	}, nil
}

// MakeBusyboxRoot fills root with busybox and the directories a
// container needs.
func MakeBusyboxRoot(root string) error {
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	b, err := os.ReadFile(Busybox)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		return err
	}
	for _, a := range busyboxApplets {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	return os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/:/bin/sh\n"), 0o644)
}

// Spec is an OCI spec for a busybox container running args, like
// `runc spec` makes (the guest view: no root.path, no cgroupsPath).
func Spec(terminal bool, args ...string) *specs.Spec {
	caps := []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Terminal: terminal,
			Args:     args,
			Env:      []string{"PATH=/bin", "TERM=xterm"},
			Cwd:      "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{},
		Hostname: "busybox",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			MaskedPaths:   []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}
