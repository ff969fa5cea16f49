package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/api"
)

// LayerExport is a container's writable layer coming back from the guest
// on a stream of its own, as a layer diff: a tar in the OCI image-layer
// format. Read it to its end, then Wait for the guest's account of it.
// Everything on the stream is the guest's word: the caller bounds and
// checks what it reads.
type LayerExport struct {
	stream net.Conn
	// read counts the bytes Read returned.
	read atomic.Int64
	// done is closed once the call returned, with resp and err set.
	done chan struct{}
	resp *exportAnswer
	err  error
	// unwatch stops the watch of the caller's context.
	unwatch func() bool
}

// exportAnswer is what the guest said of an export.
type exportAnswer struct {
	changed        bool
	bytes, entries uint64
}

// ExportLayer opens a layer stream named streamID (an id unique among the
// session's process and stream ids, as ProcessSpec.ID) and asks the guest
// to write container id's writable layer to it, maxBytes at most (0: no
// bound), if anything was written to the layer since the container was
// created. ctx bounds the call and every Read; the call is not subject to
// the bound of SetCallTimeout, as it lasts as long as the layer takes to
// come: the caller gives ctx a deadline. Its time counts as guest time.
func (c *Client) ExportLayer(ctx context.Context, id, streamID string, maxBytes int64) (*LayerExport, error) {
	op := fmt.Sprintf("export the writable layer of container %s", id)
	if err := api.ValidID(streamID); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", op, errdefs.ErrInvalidArgument, err)
	}
	if maxBytes < 0 {
		return nil, fmt.Errorf("%s: negative bound %d: %w", op, maxBytes, errdefs.ErrInvalidArgument)
	}
	s, err := openStream(c.sess, api.StreamHeader{Kind: api.StreamLayer, ID: streamID})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	e := &LayerExport{stream: s, done: make(chan struct{})}
	if d, ok := ctx.Deadline(); ok {
		_ = s.SetReadDeadline(d)
	}
	e.unwatch = context.AfterFunc(ctx, func() { _ = s.SetReadDeadline(time.Now()) })
	go func() {
		// The guest's work (sync, read, write) and the transport: guest
		// time, as for the calls account counts.
		began := time.Now()
		resp, err := c.agent.ExportLayer(ctx, &api.ExportLayerRequest{ContainerId: id, StreamId: streamID, MaxBytes: uint64(maxBytes)})
		c.guestNanos.Add(int64(time.Since(began)))
		if err != nil {
			e.err = c.mapErr(op, err)
			close(e.done)
			// Nothing more comes: what the stream holds is still read,
			// then Read fails with e.err instead of waiting.
			_ = s.SetReadDeadline(time.Now())
			return
		}
		e.resp = &exportAnswer{changed: resp.Changed, bytes: resp.Bytes, entries: resp.Entries}
		close(e.done)
	}()
	return e, nil
}

// Read reads the layer diff; io.EOF once the guest closed the stream.
// When the guest's call failed, Read fails with its error.
func (e *LayerExport) Read(p []byte) (int, error) {
	n, err := e.stream.Read(p)
	e.read.Add(int64(n))
	if err != nil && !errors.Is(err, io.EOF) {
		select {
		case <-e.done:
			if e.err != nil {
				return n, e.err
			}
		default:
		}
	}
	return n, err
}

// Close stops reading: the guest stops writing, if it still does. Wait
// still returns its answer.
func (e *LayerExport) Close() error {
	e.unwatch()
	return e.stream.Close()
}

// Wait returns the guest's answer once it has come: whether the layer
// had changed (without a change the stream carried nothing) and the
// number of tar entries it says it sent. A guest whose answer does not
// match the bytes that arrived fails with errdefs.ErrDataLoss; call Wait
// after reading the stream to its end.
func (e *LayerExport) Wait(ctx context.Context) (changed bool, entries uint64, err error) {
	select {
	case <-e.done:
	case <-ctx.Done():
		return false, 0, fmt.Errorf("wait for the guest's export: %w", ctx.Err())
	}
	if e.err != nil {
		return false, 0, e.err
	}
	read := uint64(e.read.Load())
	switch {
	case !e.resp.changed && read != 0:
		return false, 0, fmt.Errorf("the guest sent %d bytes of a layer it says did not change: %w", read, errdefs.ErrDataLoss)
	case read != e.resp.bytes:
		return false, 0, fmt.Errorf("the guest says it sent %d bytes of the layer, %d arrived: %w", e.resp.bytes, read, errdefs.ErrDataLoss)
	}
	return e.resp.changed, e.resp.entries, nil
}
