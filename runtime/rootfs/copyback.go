package rootfs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// Suffixes of the directories CopyBack makes next to an upperdir.
const (
	copyBackNew = ".cocoon-new"
	copyBackOld = ".cocoon-old"
)

// guestStopWait bounds the wait, after a copy back failed, for the guest
// to stop sending.
const guestStopWait = 10 * time.Second

// Defaults of CopyBackLimits.
const (
	// DefaultCopyBackMaxBytes takes back a full default scratch disk: its
	// content plus the tar headers of as many files as it has inodes.
	DefaultCopyBackMaxBytes = DefaultScratchSize + DefaultScratchSize/10
	// DefaultCopyBackTimeout lets that much come at about 40 MB/s.
	DefaultCopyBackTimeout = 5 * time.Minute
)

// CopyBackLimits bound what one copy back takes from a guest.
type CopyBackLimits struct {
	// MaxBytes bounds the diff: a larger one is refused whole.
	MaxBytes int64
	// Timeout bounds a copy back from the request to the guest to the
	// last entry applied.
	Timeout time.Duration
	// BytesPerSecond caps how fast the diff is read; 0 is no cap.
	BytesPerSecond int64
}

// LayerDiff is a container's writable layer as its guest sends it: a tar
// in the OCI image-layer format, read to its end, then accounted for by
// Wait (runtime/agent's LayerExport).
type LayerDiff interface {
	io.Reader
	// Close stops the sender early.
	Close() error
	// Wait returns the sender's account once the stream has ended:
	// whether the layer had changed (without a change the stream is
	// empty). An error means the diff is not whole.
	Wait(ctx context.Context) (changed bool, entries uint64, err error)
}

// Exporter asks the guest for a container's writable layer, at most
// maxBytes of it, bounded by ctx.
type Exporter func(ctx context.Context, maxBytes int64) (LayerDiff, error)

// CopyBack puts what a container wrote back where it would have gone had
// the container written to the host directly, as runc's containers do.
// The guest reads its writable layer and sends it as a layer diff
// (export); the host's kernel never reads the guest's filesystem. The
// diff is applied with containerd's archive, through the policy p (what
// the container could have written under runc) and the cache's limits:
//
//   - For a root on a snapshot, the diff is the whole of the writable
//     layer: it is applied, whiteouts as overlayfs' (character devices
//     0/0, trusted.overlay.opaque), into a fresh directory next to the
//     upperdir it was seeded from, which is swapped in by two renames
//     once the guest said the diff was whole, so that a failed copy back
//     leaves the upperdir as it was.
//   - For a writable directory root (ctr run --rootfs), the diff is
//     kept in the container's directory until it is whole, then applied
//     onto the directory, whiteouts deleting.
//
// The VM must still run, with the container stopped (or never started)
// and its layer mounted. Entries the policy refuses are left out,
// attributes it refuses are taken off, and both are logged (counted, the
// first few named) and reported. A diff larger than the limit, or slower
// than the timeout, fails whole. A read-only root has nothing to give
// back.
func (c *Cache) CopyBack(ctx context.Context, r Rootfs, p Policy, export Exporter) (rep CopyBackReport, retErr error) {
	if r.Scratch == "" || (r.Upper == "" && r.Bind == "") {
		return rep, nil
	}
	lim := c.copyBackLimits()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	defer cancel()
	in := &diffReader{ctx: ctx, max: lim.MaxBytes, rate: lim.BytesPerSecond}
	defer func() {
		rep.Bytes = in.n
		if retErr != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && parent.Err() == nil {
			retErr = fmt.Errorf("copy back did not end within %s (rootfs.copy_back_timeout): %w", lim.Timeout, retErr)
		}
	}()
	diff, err := export(ctx, lim.MaxBytes)
	if err != nil {
		return rep, err
	}
	defer func() {
		diff.Close()
		if retErr != nil {
			// The guest stops once the stream is closed; its container
			// is busy until it did, and is deleted next.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(parent), guestStopWait)
			_, _, _ = diff.Wait(wctx)
			cancel()
		}
	}()
	in.r, in.start = diff, time.Now()
	br := bufio.NewReaderSize(in, 64<<10)
	if _, err := br.Peek(1); errors.Is(err, io.EOF) {
		changed, _, err := diff.Wait(ctx)
		if err == nil && changed {
			err = fmt.Errorf("the guest sent an empty diff of a layer that changed: %w", errdefs.ErrDataLoss)
		}
		return rep, err
	} else if err != nil {
		return rep, err
	}
	rep.Changed = true
	var prior *priorTree
	if r.Upper != "" {
		prior = newPriorTree(append([]string{r.Upper}, reversed(r.Lowers)...)...)
	} else {
		prior = newPriorTree(r.Bind)
	}
	defer prior.close()
	f := newDiffFilter(p, prior, &rep)
	if r.Upper != "" {
		err = replaceUpper(ctx, r.Upper, br, diff, f)
	} else {
		err = applyToDir(ctx, r, br, diff, f)
	}
	if n := rep.Denied(); n > 0 {
		log.G(ctx).WithField("refused", rep.Refused).WithField("stripped", rep.Stripped).WithField("first", rep.Examples).
			Warnf("copy back: %d entries or attributes the container could not have written were left out", n)
	}
	return rep, err
}

// replaceUpper makes the directory upper what the diff in holds, by an
// apply next to it and two renames once diff is accounted for.
func replaceUpper(ctx context.Context, upper string, in io.Reader, diff LayerDiff, f *diffFilter) (retErr error) {
	staged, old := upper+copyBackNew, upper+copyBackOld
	for _, p := range []string{staged, old} {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("copy back: remove leftover %s: %w", p, err)
		}
	}
	if err := os.Mkdir(staged, 0o700); err != nil {
		return fmt.Errorf("copy back: %w", err)
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(staged)
		}
	}()
	if err := applyDiff(ctx, staged, in, f, true); err != nil {
		return fmt.Errorf("copy back the writable layer into %s: %w", upper, err)
	}
	if _, _, err := diff.Wait(ctx); err != nil {
		return fmt.Errorf("copy back the writable layer into %s: %w", upper, err)
	}
	if err := setRootAttrs(staged, f.root, upper); err != nil {
		return fmt.Errorf("copy back: %w", err)
	}
	if err := os.Rename(upper, old); err != nil {
		return fmt.Errorf("copy back: %w", err)
	}
	if err := os.Rename(staged, upper); err != nil {
		if rerr := os.Rename(old, upper); rerr != nil {
			log.G(ctx).WithError(rerr).WithField("upperdir", upper).Error("copy back: cannot put the upperdir back")
		}
		return fmt.Errorf("copy back: %w", err)
	}
	if err := os.RemoveAll(old); err != nil {
		log.G(ctx).WithError(err).WithField("dir", old).Warn("copy back: remove the old upperdir")
	}
	return nil
}

// applyToDir applies the diff in onto the writable directory root
// r.Bind, once diff is accounted for: until then it is kept in r.Dir, so
// that a diff that is not whole changes nothing.
func applyToDir(ctx context.Context, r Rootfs, in io.Reader, diff LayerDiff, f *diffFilter) error {
	spool, err := os.CreateTemp(r.Dir, ".diff-*.tar")
	if err != nil {
		return fmt.Errorf("copy back: %w", err)
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	if _, err := io.Copy(spool, in); err != nil {
		return fmt.Errorf("copy back the writable layer: %w", err)
	}
	if _, _, err := diff.Wait(ctx); err != nil {
		return fmt.Errorf("copy back the writable layer: %w", err)
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("copy back: %w", err)
	}
	if err := applyDiff(ctx, r.Bind, bufio.NewReaderSize(spool, 64<<10), f, false); err != nil {
		return fmt.Errorf("apply the writable layer to %s: %w", r.Bind, err)
	}
	if err := setRootAttrs(r.Bind, f.root, ""); err != nil {
		return fmt.Errorf("apply the writable layer to %s: %w", r.Bind, err)
	}
	return nil
}

// diffReader reads a diff from r, bounded by ctx, at most max bytes, at
// most rate bytes per second (0: no cap).
type diffReader struct {
	ctx   context.Context
	r     io.Reader
	max   int64
	rate  int64
	start time.Time
	// n counts the bytes read.
	n int64
}

func (d *diffReader) Read(p []byte) (int, error) {
	if d.n > d.max {
		return 0, d.tooLarge()
	}
	if room := d.max - d.n + 1; int64(len(p)) > room {
		p = p[:room]
	}
	n, err := d.r.Read(p)
	d.n += int64(n)
	if d.n > d.max {
		return n, d.tooLarge()
	}
	if d.rate > 0 && n > 0 {
		due := d.start.Add(time.Duration(float64(d.n) / float64(d.rate) * float64(time.Second)))
		if wait := time.Until(due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-d.ctx.Done():
				t.Stop()
				return n, d.ctx.Err()
			}
		}
	}
	return n, err
}

func (d *diffReader) tooLarge() error {
	return fmt.Errorf("the diff is larger than the copy back bound of %d bytes (rootfs.copy_back_max_bytes): %w", d.max, errdefs.ErrResourceExhausted)
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}
