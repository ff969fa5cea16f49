//go:build linux

package agent_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/api"
)

// loopDisk attaches image to a loop device, standing in for a SCSI disk.
func loopDisk(t *testing.T, image string, readOnly bool) string {
	t.Helper()
	args := []string{"-f", "--show"}
	if readOnly {
		args = append(args, "-r")
	}
	out, err := exec.Command("losetup", append(args, image)...).CombinedOutput()
	if err != nil {
		t.Skipf("no loop devices: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	return dev
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// TestContainerOnDisks assembles a container's rootfs from real block
// devices: two EROFS layers and an ext4 scratch disk on loop devices,
// found through a sysfs laid out as the guest's SCSI controller shows
// them. Only the discovery is faked; the mounts and the OCI runtime are real.
func TestContainerOnDisks(t *testing.T) {
	agenttest.NeedContainers(t)
	for _, tool := range []string{"mkfs.erofs", "mkfs.ext4", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	work := t.TempDir()
	base := filepath.Join(work, "base")
	if err := agenttest.MakeBusyboxRoot(base); err != nil {
		t.Fatal(err)
	}
	top := filepath.Join(work, "top", "etc")
	if err := os.MkdirAll(top, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(top, "passwd"), []byte("root:x:0:0:top layer:/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.erofs", "--quiet", filepath.Join(work, "l0.img"), base)
	run(t, "mkfs.erofs", "--quiet", filepath.Join(work, "l1.img"), filepath.Join(work, "top"))
	scratch := filepath.Join(work, "scratch.img")
	if err := os.WriteFile(scratch, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(scratch, 64<<20); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.ext4", "-q", "-F", scratch)

	sys := t.TempDir()
	disks := map[uint32]string{
		1: loopDisk(t, filepath.Join(work, "l0.img"), true),
		2: loopDisk(t, filepath.Join(work, "l1.img"), true),
		3: loopDisk(t, scratch, false),
	}
	for id, dev := range disks {
		if err := os.MkdirAll(filepath.Join(sys, "bus", "scsi", "devices", fmt.Sprintf("0:0:%d:0", id), "block", filepath.Base(dev)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cs := newContainerService(t, agent.Config{Rootfs: &agent.DiskRootfs{SysDir: sys, DevDir: "/dev", Timeout: 5 * time.Second}})
	ctx := ctxFor(t, time.Minute)

	spec := agenttest.Spec(false, "sh", "-c", "cat /etc/passwd; echo kept > /new; cat /new")
	p := cs.open(t, "disk-init", false, true, true)
	_, err := cs.CreateContainer(ctx, &api.CreateContainerRequest{
		ContainerId: "disk", ProcessId: "disk-init", Spec: specJSON(t, spec), Stdout: true, Stderr: true,
		Rootfs: &api.Rootfs{
			Layers:  []*api.Disk{{ScsiId: 1, Fstype: "erofs", ReadOnly: true}, {ScsiId: 2, Fstype: "erofs", ReadOnly: true}},
			Scratch: &api.Disk{ScsiId: 3, Fstype: "ext4"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cs.cfg.ContainerDir, "disk")
	if _, err := cs.StartContainer(ctx, req("disk")); err != nil {
		t.Fatal(err)
	}
	if st := cs.wait(t, p); st.ExitStatus != 0 {
		t.Fatalf("exit %v: %s", st, p.stderr.String())
	}
	// The top layer wins, and writes land on the scratch disk.
	if out := p.stdout.String(); out != "root:x:0:0:top layer:/:/bin/sh\nkept\n" {
		t.Fatalf("output %q", out)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "scratch", "upper", "new")); err != nil || string(b) != "kept\n" {
		t.Fatalf("upper layer: %q %v", b, err)
	}
	if _, err := cs.DeleteContainer(ctx, req("disk")); err != nil {
		t.Fatal(err)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), dir) {
		t.Fatalf("mounts left under %s:\n%s", dir, mounts)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("container directory left: %v", err)
	}
}
