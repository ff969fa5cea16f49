//go:build linux

package sandbox

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	guestagent "github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/agent/reaper"
	"github.com/cocoonrt/cocoon/runtime/agent"
	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/rootfs"
)

// diskVM is a VM that hot-plugs disks (recorded, never shown to the
// in-process guest, whose rootfs is a busybox directory).
type diskVM struct {
	exited chan struct{}
	once   sync.Once // closes exited
	// failAttach makes AttachDisk of an id with this suffix fail.
	failAttach string

	mu       sync.Mutex // guards the fields below
	next     uint32
	attached map[string]string
	log      []string
}

func newDiskVM() *diskVM {
	return &diskVM{exited: make(chan struct{}), attached: map[string]string{}}
}

func (v *diskVM) PID() int                        { return os.Getpid() }
func (v *diskVM) AgentEndpoint() channel.Endpoint { return channel.Endpoint{} }
func (v *diskVM) Exited() <-chan struct{}         { return v.exited }
func (v *diskVM) ExitError() error                { return nil }
func (v *diskVM) ConsoleTail(int) []string        { return nil }
func (v *diskVM) Stop(ctx context.Context) error  { v.once.Do(func() { close(v.exited) }); return nil }
func (v *diskVM) record(format string, args ...any) {
	v.log = append(v.log, fmt.Sprintf(format, args...))
}

func (v *diskVM) AttachDisk(ctx context.Context, id, path string, readOnly bool) (hypervisor.DiskAddr, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.failAttach != "" && strings.HasSuffix(id, v.failAttach) {
		return hypervisor.DiskAddr{}, fmt.Errorf("attach disk %s: %w", id, errdefs.ErrResourceExhausted)
	}
	if _, ok := v.attached[id]; ok {
		return hypervisor.DiskAddr{}, errdefs.ErrAlreadyExists
	}
	v.attached[id] = path
	v.next++
	v.record("attach %s %s ro=%v", id, filepath.Base(path), readOnly)
	return hypervisor.DiskAddr{SCSIID: v.next}, nil
}

func (v *diskVM) DetachDisk(ctx context.Context, id string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.attached[id]; !ok {
		return errdefs.ErrNotFound
	}
	delete(v.attached, id)
	v.record("detach %s", id)
	return nil
}

func (v *diskVM) take() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	l := v.log
	v.log = nil
	return l
}

var _ hypervisor.DiskAttacher = (*diskVM)(nil)

// fakeCache stands in for the layer cache: one layer and a scratch file.
// Its CopyBack reads what the guest exports, applies nothing.
type fakeCache struct {
	mu       sync.Mutex // guards released, copied and failCopy
	released []string
	// copied are the containers whose layer was copied back.
	copied []string
	// failCopy makes CopyBack fail.
	failCopy bool
}

func (c *fakeCache) Prepare(ctx context.Context, mounts []rootfs.Mount, dir string, _ ...rootfs.PrepareOpt) (rootfs.Rootfs, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return rootfs.Rootfs{}, err
	}
	r := rootfs.Rootfs{Dir: dir, Layers: []string{"/cache/images/base.erofs", "/cache/images/app.erofs"},
		Scratch: filepath.Join(dir, rootfs.ScratchFile), Upper: filepath.Join(dir, "upper")}
	return r, os.WriteFile(r.Scratch, []byte("ext4"), 0o600)
}

func (c *fakeCache) Release(ctx context.Context, r rootfs.Rootfs) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = append(c.released, filepath.Base(r.Dir))
	return os.Remove(r.Scratch)
}

func (c *fakeCache) CopyBack(ctx context.Context, r rootfs.Rootfs, _ rootfs.Policy, export rootfs.Exporter) (rootfs.CopyBackReport, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var rep rootfs.CopyBackReport
	if _, err := os.Stat(r.Scratch); err != nil {
		return rep, err // released before it was copied back
	}
	if c.failCopy {
		return rep, errors.New("no space left on device")
	}
	diff, err := export(ctx, 1<<30)
	if err != nil {
		return rep, err
	}
	defer diff.Close()
	// The guest's layer (a directory root: the whole root) as a tar.
	tr := tar.NewReader(diff)
	for {
		if _, err := tr.Next(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return rep, err
		}
		rep.Entries++
	}
	changed, _, err := diff.Wait(ctx)
	if err != nil {
		return rep, err
	}
	if !changed || rep.Entries == 0 {
		return rep, fmt.Errorf("the guest sent %d entries of a layer changed=%v", rep.Entries, changed)
	}
	rep.Changed = true
	c.copied = append(c.copied, filepath.Base(r.Dir))
	return rep, nil
}

func (c *fakeCache) copiedDirs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.copied...)
}

func (c *fakeCache) releasedDirs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.released...)
}

type quietSystem struct{}

func (quietSystem) SetWallClock(time.Time) error { return nil }
func (quietSystem) AddEntropy([]byte) error      { return nil }
func (quietSystem) SetHostname(string) error     { return nil }
func (quietSystem) PowerOff() error              { return nil }

// containerSandbox is a Sandbox whose guest is an in-process agent
// running busybox containers with this host's runc.
func containerSandbox(t *testing.T, gcfg guestagent.Config) (*Sandbox, *diskVM, *fakeCache) {
	t.Helper()
	agenttest.NeedContainers(t)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	// As PID 1 does: container processes are orphans adopted from
	// runc's pid files, and may exit before they are.
	r := reaper.New(reaper.Options{Orphans: true})
	gcfg.System, gcfg.Reaper = quietSystem{}, r
	gcfg.OutputDrainIdle = 300 * time.Millisecond
	gcfg = agenttest.Config(t, gcfg)
	svc, err := guestagent.New(gcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	agenttest.Serve(t, svc, conns[1])
	client, err := agent.Connect(context.Background(), conns[0])
	if err != nil {
		t.Fatal(err)
	}
	vm := newDiskVM()
	cache := &fakeCache{}
	dir := t.TempDir()
	s := &Sandbox{
		Namespace: "test", ID: "sb", Dir: filepath.Join(dir, "state"),
		vm: vm, agent: client, stopTimeout: time.Second,
		rootfs: cache, containersDir: filepath.Join(dir, "data", "containers", "test", "sb"),
		life: newLifecycle(PhaseReady), watchDone: closedChan(), stopped: make(chan struct{}),
	}
	t.Cleanup(func() { _ = s.teardown(context.Background()) })
	return s, vm, cache
}

// hostSpec is a container's spec as containerd writes it, with the parts
// GuestSpec removes.
func hostSpec(terminal bool, args ...string) *specs.Spec {
	s := agenttest.Spec(terminal, args...)
	s.Root = &specs.Root{Path: "rootfs"}
	s.Linux.CgroupsPath = "/default/web"
	s.Process.ApparmorProfile = "cri-containerd.apparmor.d"
	return s
}

func TestSandboxContainer(t *testing.T) {
	s, vm, cache := containerSandbox(t, guestagent.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out agenttest.Buffer
	init, err := s.CreateContainer(ctx, ContainerSpec{
		ID: "web", Spec: hostSpec(false, "sh", "-c", "echo up; exec sleep 1000"),
		Rootfs: []rootfs.Mount{{Type: "overlay", Source: "overlay"}}, Stdout: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	if init.ID() != "p1" {
		t.Errorf("init process id %q", init.ID())
	}
	want := []string{"attach web-layer-0 base.erofs ro=true", "attach web-layer-1 app.erofs ro=true", "attach web-scratch scratch.ext4 ro=false"}
	if got := vm.take(); !reflect.DeepEqual(got, want) {
		t.Fatalf("disks: %q", got)
	}
	if _, err := s.CreateContainer(ctx, ContainerSpec{ID: "web", Spec: hostSpec(false, "true")}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("same id twice: %v", err)
	}
	if err := s.StartContainer(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	var execOut agenttest.Buffer
	p, err := s.ExecProcess(ctx, "web", "exec-with-a-long-containerd-id-"+strings.Repeat("x", 64),
		&specs.Process{Args: []string{"echo", "exec"}, Cwd: "/", Env: []string{"PATH=/bin"}, ApparmorProfile: "host-only"},
		nil, &execOut, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 || execOut.String() != "exec\n" || p.ID() != "p2" {
		t.Fatalf("exec %s: %+v %v %q", p.ID(), st, err, execOut.String())
	}
	if err := s.PauseContainer(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if err := s.ResumeContainer(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateContainer(ctx, "web", &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: new(int64(50))}}); err != nil {
		t.Fatal(err)
	}
	if m, err := s.ContainerStats(ctx, "web"); err != nil || m.CPU == nil {
		t.Fatalf("stats: %v %v", m, err)
	}
	if pids, err := s.ContainerPids(ctx, "web"); err != nil || len(pids) == 0 {
		t.Fatalf("pids: %v %v", pids, err)
	}
	if err := s.DeleteContainer(ctx, "web"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete running: %v", err)
	}
	if got := vm.take(); len(got) != 0 {
		t.Fatalf("a refused delete touched the disks: %q", got)
	}
	if err := s.KillContainer(ctx, "web", syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	if st, err := init.Wait(ctx); err != nil || st.Code != 137 || out.String() != "up\n" {
		t.Fatalf("init: %+v %v %q", st, err, out.String())
	}
	if err := s.DeleteContainer(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	want = []string{"detach web-scratch", "detach web-layer-1", "detach web-layer-0"}
	if got := vm.take(); !reflect.DeepEqual(got, want) {
		t.Fatalf("detach: %q", got)
	}
	if got := cache.releasedDirs(); !reflect.DeepEqual(got, []string{"web"}) {
		t.Fatalf("released %q", got)
	}
	// The guest reported the writable layer changed (a directory root
	// always does): it went to the host at the pause (for a commit) and
	// again before the release.
	if got := cache.copiedDirs(); !reflect.DeepEqual(got, []string{"web", "web"}) {
		t.Fatalf("copied back %q, want web's layer at the pause and at the delete", got)
	}
	if _, err := os.Stat(filepath.Join(s.containersDir, "web")); !os.IsNotExist(err) {
		t.Fatalf("container dir left: %v", err)
	}
	for name, err := range map[string]error{
		"start":  s.StartContainer(ctx, "web"),
		"delete": s.DeleteContainer(ctx, "web"),
		"kill":   s.KillContainer(ctx, "web", syscall.SIGTERM, true),
	} {
		if !errdefs.IsNotFound(err) {
			t.Errorf("%s after delete: %v", name, err)
		}
	}
}

// TestSandboxFlushThenStop: a stopped container flushed before its VM
// stops has its changed layer copied back, is not deleted in the guest
// and its disks are not detached; Stop releases its rootfs. A running
// container cannot be flushed.
func TestSandboxFlushThenStop(t *testing.T) {
	s, vm, cache := containerSandbox(t, guestagent.Config{})
	ctx := context.Background()
	init, err := s.CreateContainer(ctx, ContainerSpec{ID: "web", Spec: hostSpec(false, "sleep", "60")})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StartContainer(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if err := s.FlushContainer(ctx, "web"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("flush of a running container: %v", err)
	}
	if err := s.KillContainer(ctx, "web", syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	if _, err := init.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.FlushContainer(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if got := cache.copiedDirs(); !reflect.DeepEqual(got, []string{"web"}) {
		t.Errorf("copied back %q, want web's layer", got)
	}
	vm.take()
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if got := vm.take(); len(got) != 0 {
		t.Errorf("stop detached disks: %q", got)
	}
	if got := cache.copiedDirs(); !reflect.DeepEqual(got, []string{"web"}) {
		t.Errorf("copied back %q after the stop, want web's layer once", got)
	}
	if got := cache.releasedDirs(); !reflect.DeepEqual(got, []string{"web"}) {
		t.Errorf("released %q", got)
	}
}

// TestSandboxCopyBackFailure: a layer that cannot be copied back does not
// keep the container: it is deleted and its rootfs released all the same.
func TestSandboxCopyBackFailure(t *testing.T) {
	s, _, cache := containerSandbox(t, guestagent.Config{})
	ctx := context.Background()
	cache.mu.Lock()
	cache.failCopy = true
	cache.mu.Unlock()
	if _, err := s.CreateContainer(ctx, ContainerSpec{ID: "web", Spec: hostSpec(false, "true")}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteContainer(ctx, "web"); err != nil {
		t.Fatalf("delete with a failing copy back: %v", err)
	}
	if got := cache.releasedDirs(); !reflect.DeepEqual(got, []string{"web"}) {
		t.Fatalf("released %q", got)
	}
}

func TestSandboxContainerRefusedSpec(t *testing.T) {
	s, vm, cache := containerSandbox(t, guestagent.Config{})
	spec := hostSpec(false, "true")
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/mnt", Type: "ext4", Source: "/dev/sdb1"})
	_, err := s.CreateContainer(context.Background(), ContainerSpec{ID: "vol", Spec: spec})
	if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "mount /mnt") {
		t.Fatalf("host filesystem: %v", err)
	}
	// A bind mount needs the sandbox's share, which this one lacks.
	spec = hostSpec(false, "true")
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: "/srv/data"})
	_, err = s.CreateContainer(context.Background(), ContainerSpec{ID: "vol", Spec: spec})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "without a share") {
		t.Fatalf("bind mount without a share: %v", err)
	}
	if len(vm.take()) != 0 || len(cache.releasedDirs()) != 0 {
		t.Fatal("a refused spec touched disks or the cache")
	}
	if _, err := s.CreateContainer(context.Background(), ContainerSpec{ID: "../x", Spec: hostSpec(false, "true")}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad id: %v", err)
	}
}

func TestSandboxContainerCreateUndo(t *testing.T) {
	s, vm, cache := containerSandbox(t, guestagent.Config{})
	ctx := context.Background()
	vm.failAttach = "-scratch"
	if _, err := s.CreateContainer(ctx, ContainerSpec{ID: "web", Spec: hostSpec(false, "true")}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("attach failure: %v", err)
	}
	want := []string{"attach web-layer-0 base.erofs ro=true", "attach web-layer-1 app.erofs ro=true", "detach web-layer-1", "detach web-layer-0"}
	if got := vm.take(); !reflect.DeepEqual(got, want) {
		t.Fatalf("disks: %q", got)
	}
	if got := cache.releasedDirs(); !reflect.DeepEqual(got, []string{"web"}) {
		t.Fatalf("released %q", got)
	}
	// A guest failure is undone too, and the id is free again.
	vm.failAttach = ""
	bad := hostSpec(false, "true")
	bad.Mounts = append(bad.Mounts, specs.Mount{Destination: "/x", Type: "tmpfs", Source: "tmpfs", Options: []string{"no-such-option=1"}})
	if _, err := s.CreateContainer(ctx, ContainerSpec{ID: "web", Spec: bad}); err == nil {
		t.Fatal("create with a mount runc refuses succeeded")
	}
	vm.take()
	if _, err := s.CreateContainer(ctx, ContainerSpec{ID: "web", Spec: hostSpec(false, "true")}); err != nil {
		t.Fatal(err)
	}
	// Stopping the sandbox gives back what its containers still hold.
	if err := s.teardown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := cache.releasedDirs(); len(got) != 3 {
		t.Fatalf("released %q", got)
	}
	if _, err := os.Stat(s.containersDir); !os.IsNotExist(err) {
		t.Fatalf("containers dir left: %v", err)
	}
	if _, err := s.CreateContainer(ctx, ContainerSpec{ID: "late", Spec: hostSpec(false, "true")}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("create after stop: %v", err)
	}
}

func TestSandboxEvents(t *testing.T) {
	cgroups := t.TempDir()
	s, _, _ := containerSandbox(t, guestagent.Config{CgroupRoot: cgroups})
	ctx := context.Background()
	cg := filepath.Join(cgroups, "cocoon", "hog")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	events := filepath.Join(cg, "memory.events")
	if err := os.WriteFile(events, []byte("oom_kill 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateContainer(ctx, ContainerSpec{ID: "hog", Spec: hostSpec(false, "true")}); err != nil {
		t.Fatal(err)
	}
	ch := s.Events()
	if s.Events() != ch {
		t.Fatal("Events returned another channel")
	}
	if err := os.WriteFile(events, []byte("oom_kill 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-ch:
		if e.Kind != EventOOM || e.ContainerID != "hog" {
			t.Fatalf("event %+v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no OOM event")
	}
	if err := s.teardown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("event after stop")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("events channel not closed on stop")
	}
}

func TestEventsOfStoppedSandbox(t *testing.T) {
	s := &Sandbox{life: newLifecycle(PhaseReady), watchDone: closedChan(), stopped: make(chan struct{})}
	if err := s.closeContainers(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-s.Events(); ok {
		t.Fatal("open events channel on a stopped sandbox")
	}
	if _, err := s.CreateContainer(context.Background(), ContainerSpec{ID: "x"}); err == nil {
		t.Fatal("create without a spec")
	}
}

// closedChan is a closed channel: the watch of a sandbox that tests made
// by hand, which has none.
func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
