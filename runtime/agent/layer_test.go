//go:build linux

package agent

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	guestagent "github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/agenttest"
	"github.com/cocoonrt/cocoon/guest/api"
)

// waitExport exports container id's layer on stream sid, reads it to its
// end as a tar and returns the guest's account.
func waitExport(ctx context.Context, t *testing.T, c *Client, id, sid string) (bool, uint64, error) {
	t.Helper()
	e, err := c.ExportLayer(ctx, id, sid, 0)
	if err != nil {
		return false, 0, err
	}
	defer e.Close()
	if _, err := readTar(e); err != nil {
		return false, 0, err
	}
	return e.Wait(ctx)
}

// readTar reads a tar to its end and returns its entries by name.
func readTar(r io.Reader) (map[string]*tar.Header, error) {
	tr := tar.NewReader(r)
	out := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out[h.Name] = h
	}
}

// stoppedContainer creates container id running script and waits for it
// to exit; its root (the agenttest directory root) is its writable layer.
func stoppedContainer(ctx context.Context, t *testing.T, c *Client, id, script string) {
	t.Helper()
	init, err := c.CreateContainer(ctx, ContainerCreate{ID: id, ProcessID: id + "-init",
		Spec: mustJSON(t, agenttest.Spec(false, "sh", "-c", script)), Rootfs: oneLayer})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st, err := init.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("%s: %+v %v", id, st, err)
	}
}

// TestExportLayer takes a stopped container's writable layer back as a
// tar: the root first, what the container wrote with its content and
// attributes, and a count the client checks against what arrived.
func TestExportLayer(t *testing.T) {
	c := newContainerHarness(t, guestagent.Config{})
	ctx := testCtx(t, time.Minute)
	stoppedContainer(ctx, t, c, "writer", "echo hello > /written; ln -s written /link; ln /written /written.hard; mkfifo /fifo; chmod 4711 /written")
	e, err := c.ExportLayer(ctx, "writer", "x1", 0)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(e)
	first, err := tr.Next()
	if err != nil || first.Name != "./" || first.Typeflag != tar.TypeDir {
		t.Fatalf("first entry %+v, %v; want the root directory", first, err)
	}
	got := map[string]*tar.Header{}
	content := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			content[h.Name] = string(b)
		}
	}
	changed, entries, err := e.Wait(ctx)
	if err != nil || !changed || entries != uint64(len(got)+1) {
		t.Fatalf("wait: %v %d %v; read %d entries", changed, entries, err, len(got)+1)
	}
	if h := got["written"]; h == nil || content["written"] != "hello\n" || h.Mode != 0o4711 {
		t.Errorf("written: %+v %q", h, content["written"])
	}
	if h := got["link"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "written" {
		t.Errorf("link: %+v", h)
	}
	if h := got["written.hard"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "written" {
		t.Errorf("written.hard: %+v", h)
	}
	if h := got["fifo"]; h == nil || h.Typeflag != tar.TypeFifo {
		t.Errorf("fifo: %+v", h)
	}
	if h := got["bin/"]; h == nil || h.Typeflag != tar.TypeDir {
		t.Errorf("bin/: %+v", h)
	}
}

// TestExportLayerBounds: the guest stops at the bound it is given, and
// stops at once when the host closes the stream; the container can be
// deleted right after.
func TestExportLayerBounds(t *testing.T) {
	c := newContainerHarness(t, guestagent.Config{})
	ctx := testCtx(t, time.Minute)
	stoppedContainer(ctx, t, c, "big", "dd if=/dev/zero of=/big bs=65536 count=160 2>/dev/null")
	// busybox and /big: megabytes; the bound is 64 KiB.
	e, err := c.ExportLayer(ctx, "big", "b1", 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, e)
	if _, _, err := e.Wait(ctx); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("export over the bound: %v", err)
	}
	if n > 64<<10 {
		t.Errorf("the guest sent %d bytes past a bound of 64 KiB", n)
	}
	e.Close()

	e, err = c.ExportLayer(ctx, "big", "b2", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(io.Discard, e, 4096); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	e.Close()
	if _, _, err := e.Wait(ctx); err == nil {
		t.Fatal("an export the host stopped reading succeeded")
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("the guest took %v to stop after the host closed the stream", took)
	}
	if err := c.DeleteContainer(ctx, "big"); err != nil {
		t.Fatalf("delete after a stopped export: %v", err)
	}
}

// TestExportLayerUnchanged: a layer whose write count did not move comes
// back as nothing.
func TestExportLayerUnchanged(t *testing.T) {
	c := newContainerHarness(t, guestagent.Config{Rootfs: unchangedRootfs{}})
	ctx := testCtx(t, time.Minute)
	stoppedContainer(ctx, t, c, "idle", "true")
	e, err := c.ExportLayer(ctx, "idle", "u1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if n, err := io.Copy(io.Discard, e); err != nil || n != 0 {
		t.Fatalf("read %d, %v", n, err)
	}
	if changed, _, err := e.Wait(ctx); err != nil || changed {
		t.Fatalf("wait: %v %v", changed, err)
	}
}

// unchangedRootfs is agenttest.DirRootfs whose layer never changes.
type unchangedRootfs struct{ agenttest.DirRootfs }

func (u unchangedRootfs) Assemble(ctx context.Context, dir string, r *api.Rootfs) (*guestagent.Mounted, error) {
	m, err := u.DirRootfs.Assemble(ctx, dir, r)
	if m != nil {
		m.Changed = func() (bool, error) { return false, nil }
	}
	return m, err
}
