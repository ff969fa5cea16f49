//go:build linux

package agent

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/guest/api"
)

// exportStall bounds how long one write of a layer diff may wait for the
// host to take it: a host that stopped reading without closing the stream
// must not keep the container busy.
const exportStall = 30 * time.Second

// ExportLayer writes a created, paused or stopped container's writable layer to
// the layer stream the host opened, as a layer diff (writeLayerDiff), if
// anything was written to it since its overlay was assembled; the stream
// is closed before the answer. The container is busy meanwhile: no
// start, no delete.
func (s *Service) ExportLayer(ctx context.Context, req *api.ExportLayerRequest) (*api.ExportLayerResponse, error) {
	if err := api.ValidID(req.StreamId); err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	c, err := s.containers.get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	if err := c.begin(opExport); err != nil {
		return nil, err
	}
	defer c.end(opExport, true)
	// Claimed first: the host opened the stream before this call and
	// reads it until it ends.
	streams, err := s.streams.claim(ctx, req.StreamId, []api.StreamKind{api.StreamLayer}, s.cfg.StreamTimeout)
	if err != nil {
		return nil, err
	}
	conn := streams[api.StreamLayer]
	defer conn.Close()
	c.mu.Lock()
	deleted := c.runtimeDeleted
	c.mu.Unlock()
	if deleted {
		// A delete got past the runtime and may have unmounted the layer:
		// what is left of it is not the container's.
		return nil, fmt.Errorf("container %s: its writable layer is being unmounted by a delete: %w", c.id, errdefs.ErrNotFound)
	}
	if c.rootfs == nil || c.rootfs.Upper == "" {
		return &api.ExportLayerResponse{}, nil
	}
	changed, err := c.rootfs.changed()
	if err != nil {
		log.G(ctx).WithError(err).WithField("container", c.id).Warn("cannot tell whether the writable layer changed; exporting it")
		changed = true
	}
	if !changed {
		return &api.ExportLayerResponse{}, nil
	}
	began := time.Now()
	w := newStreamWriter(ctx, conn)
	st, err := writeLayerDiff(ctx, w, c.rootfs.Upper, req.MaxBytes)
	w.stop()
	if err != nil {
		if w.hostGone() {
			return nil, fmt.Errorf("container %s: the host stopped reading the writable layer: %w", c.id, errdefs.ErrAborted)
		}
		return nil, fmt.Errorf("container %s: export the writable layer: %w", c.id, err)
	}
	log.G(ctx).WithField("container", c.id).WithField("bytes", st.bytes).WithField("entries", st.entries).
		WithField("export_ms", time.Since(began).Milliseconds()).Info("writable layer exported")
	return &api.ExportLayerResponse{Changed: true, Bytes: st.bytes, Entries: st.entries}, nil
}

// streamWriter writes to a layer stream, each write bounded by
// exportStall, and fails at once when the host closes the stream (the
// host sends nothing on it, so a read that returns means it is gone) or
// ctx ends.
type streamWriter struct {
	conn net.Conn
	// mu guards gone and the write deadline, so that a deadline set for
	// a write never undoes the one that ends the stream.
	mu   sync.Mutex
	gone bool
	// host is set when the host's side was seen closed.
	host bool
	done chan struct{}
	quit chan struct{}
}

func newStreamWriter(ctx context.Context, conn net.Conn) *streamWriter {
	w := &streamWriter{conn: conn, done: make(chan struct{}), quit: make(chan struct{})}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_, _ = conn.Read(make([]byte, 1))
	}()
	go func() {
		defer close(w.done)
		host := false
		select {
		case <-closed:
			host = true
		case <-ctx.Done():
		case <-w.quit:
			// Ends the read above.
			_ = conn.SetReadDeadline(time.Now())
			return
		}
		w.mu.Lock()
		w.gone, w.host = true, host
		_ = conn.SetWriteDeadline(time.Now())
		w.mu.Unlock()
	}()
	return w
}

func (w *streamWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.gone {
		w.mu.Unlock()
		return 0, net.ErrClosed
	}
	_ = w.conn.SetWriteDeadline(time.Now().Add(exportStall))
	w.mu.Unlock()
	return w.conn.Write(p)
}

// stop ends the watch of the stream.
func (w *streamWriter) stop() {
	close(w.quit)
	<-w.done
}

// hostGone reports whether the host closed the stream before the end.
func (w *streamWriter) hostGone() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.host
}
