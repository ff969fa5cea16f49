//go:build linux

package agent_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/api"
)

// bindShare stands in for virtio-fs on this host: it bind-mounts dir,
// or fails with err.
type bindShare struct {
	dir string
	err error
}

func (b bindShare) MountShare(root string) error {
	if b.err != nil {
		return b.err
	}
	return unix.Mount(b.dir, root, "", unix.MS_BIND, "")
}

// TestContainerSharedBindMount: a container's bind mount whose source is
// in the share reaches the OCI runtime after the share is mounted, and
// the container reads the host's file through it.
func TestContainerSharedBindMount(t *testing.T) {
	host := t.TempDir()
	if err := os.MkdirAll(filepath.Join(host, "c1", "vol"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(host, "c1", "vol", "hello.txt"), []byte("from the host\n"), 0o644)
	root := filepath.Join(t.TempDir(), "shared")
	cs := newContainerService(t, agent.Config{ShareRoot: root, Share: bindShare{dir: host}})
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	spec := agenttest.Spec(false, "cat", "/data/hello.txt")
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: root + "/c1/vol", Options: []string{"rbind", "ro"}})
	p := cs.create(t, "shared", "shared-init", spec, false, true, false)
	ctx := ctxFor(t, time.Minute)
	if _, err := cs.StartContainer(ctx, req("shared")); err != nil {
		t.Fatal(err)
	}
	if st := cs.wait(t, p); st.ExitStatus != 0 || p.stdout.String() != "from the host\n" {
		t.Fatalf("cat through the share: %v %q", st, p.stdout.String())
	}
	if _, err := cs.DeleteContainer(ctx, req("shared")); err != nil {
		t.Fatal(err)
	}
}

// TestContainerSharedBindMountFails: a share that cannot be mounted, or
// does not hold a source, fails the create clearly and leaves nothing.
func TestContainerSharedBindMountFails(t *testing.T) {
	root := filepath.Join(t.TempDir(), "shared")
	for _, tc := range []struct {
		name  string
		share agent.ShareMounter
		is    error
		want  string
	}{
		{"no share", bindShare{err: unix.ENODEV}, errdefs.ErrFailedPrecondition, "mount the directory the host shares (virtio-fs tag " + api.ShareTag + ")"},
		{"missing source", bindShare{dir: t.TempDir()}, errdefs.ErrInvalidArgument, "its source " + root + "/c1/vol is not in the directory the host shares"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := newContainerService(t, agent.Config{ShareRoot: root, Share: tc.share})
			t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
			spec := agenttest.Spec(false, "true")
			spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: root + "/c1/vol"})
			p := cs.open(t, "c-init", false, true, false)
			_, err := cs.CreateContainer(ctxFor(t, time.Minute), &api.CreateContainerRequest{
				ContainerId: "c", ProcessId: "c-init", Spec: specJSON(t, spec), Rootfs: oneLayer, Stdout: true,
			})
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("create: %v, want %v mentioning %q", err, tc.is, tc.want)
			}
			p.copied.Wait() // the stream was closed
			if _, err := os.Stat(filepath.Join(cs.cfg.ContainerDir, "c")); !os.IsNotExist(err) {
				t.Errorf("container directory left: %v", err)
			}
		})
	}
}
