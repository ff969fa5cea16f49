package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBindMounts: a container's bind mounts reach the VM through the
// sandbox's virtio-fs share. A read-write directory written in the guest
// is written on the host; a read-only file refuses writes; a symlink in a
// shared directory resolves in the container, never to the host's files;
// a sandbox with a share refuses a checkpoint, naming why; and nothing of
// the share (mounts, virtiofsd) is left after the container.
func TestBindMounts(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			dir := t.TempDir()
			data := filepath.Join(dir, "data")
			hosts := filepath.Join(dir, "hosts")
			if err := os.Mkdir(data, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(data, "in"), []byte("from-the-host\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(hosts, []byte("10.4.0.9 peer\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			// /etc on the host has shadow; the busybox image has none.
			if err := os.Symlink("/etc", filepath.Join(data, "escape")); err != nil {
				t.Fatal(err)
			}
			removeAtEnd(t, c, "bind1", "bind2")
			out, err := c.Ctr("run", "--rm", "--runtime", runtimeName,
				"--mount", "type=bind,src="+data+",dst=/data,options=rbind:rw",
				"--mount", "type=bind,src="+hosts+",dst=/etc/hosts,options=rbind:ro",
				img, "bind1", "sh", "-c",
				`cat /data/in; echo written-in-the-guest > /data/out; cat /etc/hosts
				 if echo x >> /etc/hosts; then echo ro-WRITTEN; else echo ro-refused; fi
				 if cat /data/escape/shadow >/dev/null 2>&1; then echo ESCAPED; else echo contained; fi`)
			if err != nil {
				t.Fatalf("run with bind mounts: %v\n%s", err, out)
			}
			for _, want := range []string{"from-the-host", "10.4.0.9 peer", "ro-refused", "contained"} {
				if !strings.Contains(out, want) {
					t.Errorf("the guest's output lacks %q:\n%s", want, out)
				}
			}
			if got, err := os.ReadFile(filepath.Join(data, "out")); err != nil || string(got) != "written-in-the-guest\n" {
				t.Errorf("the guest's write on the host: %q, %v", got, err)
			}
			if got, _ := os.ReadFile(hosts); string(got) != "10.4.0.9 peer\n" {
				t.Errorf("the read-only file changed on the host: %q", got)
			}

			// A sandbox that shares host directories is not checkpointed.
			c.MustCtr("run", "-d", "--runtime", runtimeName, "--mount", "type=bind,src="+data+",dst=/data,options=rbind:rw", img, "bind2", "sleep", "600")
			c.WaitStatus(t, "bind2", "RUNNING")
			if out, err := c.Ctr("container", "checkpoint", "--task", "bind2", "checkpoint/bind2:1"); err == nil || !strings.Contains(out+err.Error(), "virtio-fs") {
				t.Errorf("checkpoint of a sandbox with a share: %v\n%s\nwant a refusal naming virtio-fs", err, out)
			}
			killAndRemove(t, c, "bind2")
			c.WaitNoShim(t)
			if _, err := os.Stat(filepath.Join(data, "in")); err != nil {
				t.Errorf("the host's directory after the container: %v", err)
			}
		})
	}
}
