package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

// The claiming side of spares (spare.go): a start that takes a spare's
// VM over.

// claimedSpare is a spare's VM taken over by a sandbox's start.
type claimedSpare struct {
	handoff hypervisor.Handoff
	files   []*os.File
	// agent is the parked agent connection (virtio-serial), or nil.
	agent net.Conn
}

// close releases what the claim holds that the start did not take.
func (c *claimedSpare) close() {
	closeFiles(c.files)
	if c.agent != nil {
		c.agent.Close()
	}
}

// claimSpare takes the spare of key under stateDir if one waits; nil if
// none does (no socket, or nobody serving it).
func claimSpare(ctx context.Context, stateDir, key string) (*claimedSpare, error) {
	c, err := askSpare(ctx, stateDir, key, spareClaim, spareIOTimeout)
	if c == nil || err != nil {
		return nil, err
	}
	defer c.Close()
	buf, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(8*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("claim the spare of %s: %w", key, err)
	}
	var files []*os.File
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, fmt.Errorf("the spare of %s: %w", key, err)
		}
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				files = append(files, os.NewFile(uintptr(fd), "spare"))
			}
		}
	}
	var r spareReply
	if err := json.Unmarshal(buf[:n], &r); err != nil || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeFiles(files)
		return nil, fmt.Errorf("the spare of %s answered what cannot be read (%d bytes, flags %#x): %v", key, n, flags, err)
	}
	if r.Error != "" || r.Handoff == nil {
		closeFiles(files)
		return nil, fmt.Errorf("the spare of %s refused the claim: %s", key, r.Error)
	}
	cs := &claimedSpare{handoff: *r.Handoff, files: files}
	if r.AgentConn {
		if len(files) == 0 {
			return nil, fmt.Errorf("the spare of %s sent no agent connection", key)
		}
		last := files[len(files)-1]
		cs.files = files[:len(files)-1]
		conn, err := net.FileConn(last)
		last.Close()
		if err != nil {
			cs.close()
			return nil, fmt.Errorf("the spare's agent connection: %w", err)
		}
		cs.agent = conn
	}
	// The VM is ours from here: its state directory must be a spare's.
	want := filepath.Join(stateDir, SpareNamespace) + string(filepath.Separator)
	if d := cs.handoff.StateDir; !strings.HasPrefix(d, want) || strings.Contains(strings.TrimPrefix(d, want), string(filepath.Separator)) {
		cs.close()
		return nil, fmt.Errorf("the spare of %s is in %q, not in %s", key, cs.handoff.StateDir, want)
	}
	return cs, nil
}

// takeSpareDir moves the claimed spare's state directory to dir, the
// sandbox's, where its QEMU runs on. It fails with os.ErrExist if dir is
// there. On any failure the spare's VM is ended.
func takeSpareDir(ctx context.Context, d hypervisor.Driver, c *claimedSpare, dir string) error {
	var err error
	for try := 0; try < 3; try++ {
		if err = os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
			break
		}
		if _, serr := os.Lstat(dir); serr == nil {
			err = os.ErrExist
			break
		}
		// The namespace directory goes with its last sandbox, maybe
		// between the two calls: then it is made again.
		if err = os.Rename(c.handoff.StateDir, dir); !errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
		err = os.ErrExist
	}
	if err != nil {
		endSpare(ctx, d, c)
		return err
	}
	// The directory of spares goes with the last one (openSpareLock).
	_ = os.Remove(filepath.Dir(c.handoff.StateDir))
	return nil
}

// adoptSpare takes the claimed spare's VM over, its state directory now
// dir.
func adoptSpare(ctx context.Context, d hypervisor.Driver, c *claimedSpare, dir string) (hypervisor.VM, error) {
	files := c.files
	c.files = nil
	a, ok := d.(hypervisor.Adopter)
	if !ok {
		closeFiles(files)
		return nil, fmt.Errorf("the %s driver cannot take a spare VM over: %w", d.Name(), errdefs.ErrNotImplemented)
	}
	return a.Adopt(ctx, c.handoff, files, dir)
}

// endSpare ends a claimed spare's VM that no sandbox takes, in its own
// state directory, and removes that.
func endSpare(ctx context.Context, d hypervisor.Driver, c *claimedSpare) {
	ctx = context.WithoutCancel(ctx)
	if vm, err := adoptSpare(ctx, d, c, c.handoff.StateDir); err == nil {
		if err := vm.Stop(ctx); err != nil {
			log.G(ctx).WithError(err).Warn("stop a spare vm that no sandbox took")
		}
	}
	if err := os.RemoveAll(c.handoff.StateDir); err != nil {
		log.G(ctx).WithError(err).Warn("remove a spare's state")
	}
}

// askSpare sends op to the spare of key under stateDir and returns the
// connection, its deadline set to timeout (or ctx's, if sooner), for the
// answer; nil, and no error, if no spare is there (no socket, or nobody
// serving it: a spare that was killed).
func askSpare(ctx context.Context, stateDir, key, op string, timeout time.Duration) (*net.UnixConn, error) {
	_, sockPath := SparePaths(stateDir, key)
	conn, err := channel.DialUnixNetwork(ctx, "unixpacket", sockPath)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reach the spare of %s: %w", key, err)
	}
	c := conn.(*net.UnixConn)
	deadline := time.Now().Add(timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = c.SetDeadline(deadline)
	req, _ := json.Marshal(spareRequest{Op: op, Key: key})
	if _, err := c.Write(req); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s the spare of %s: %w", op, key, err)
	}
	return c, nil
}
