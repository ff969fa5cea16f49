package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/cocoonrt/cocoon/runtime/config"
)

// copyBackMiB are the sizes a container writes to its root before its
// task is deleted, for the copy back figures.
var copyBackMiB = []int{10, 200}

// copyBackSamples is how many deletes each size is timed over.
const copyBackSamples = 3

// copyBackResults are the deletes after writes, Cocoon next to runc.
func copyBackResults(f ctrdFigures) []Result {
	var out []Result
	for k, mib := range copyBackMiB {
		r := median(f.deleteAfter[1][k])
		out = append(out, Result{Name: fmt.Sprintf("ctr task rm after %d MiB written (cocoon: copy back)", mib), Unit: "ms",
			Median: median(f.deleteAfter[0][k]), Samples: f.deleteAfter[0][k], Runc: &r, RuncSamples: f.deleteAfter[1][k]})
	}
	return out
}

// benchCopyBackOnly measures the deletes after writes of both runtimes
// alone (bench -only copyback), through a private containerd.
func benchCopyBackOnly(ctx context.Context, cfg *config.Config) (f ctrdFigures, retErr error) {
	b, err := startCtrd(cfg.Runtime.StateDir, cfg.Runtime.DataDir)
	if err != nil {
		return f, err
	}
	defer b.close()
	for i, rt := range []string{runtimeCocoon, runtimeRunc} {
		for _, mib := range copyBackMiB {
			d, err := b.deleteAfterWrites(ctx, rt, mib, copyBackSamples)
			if err != nil {
				return f, err
			}
			f.deleteAfter[i] = append(f.deleteAfter[i], d)
		}
	}
	return f, nil
}

// upperdirOption finds the upperdir in `ctr snapshots mounts` output.
var upperdirOption = regexp.MustCompile(`upperdir=([^,\s]+)`)

// deleteAfterWrites times `ctr task rm` of a container of runtime rt that
// wrote mib MiB to a file in its root and exited, n times. For Cocoon the
// delete holds the copy back of the writable layer into the snapshot (and
// the VM's stop); runc's container wrote into the upperdir directly, so
// its delete is the reference. Each sample checks afterwards that the
// file is in the snapshot's upperdir at its full size, so that a copy back
// that failed cannot pass for a fast one.
func (b *ctrdBench) deleteAfterWrites(ctx context.Context, rt string, mib, n int) ([]float64, error) {
	var out []float64
	for i := 0; i < n; i++ {
		id := b.newID(fmt.Sprintf("write%d", mib))
		if err := b.ctr(ctx, io.Discard, "run", "-d", "--runtime", rt, b.image, id,
			"dd", "if=/dev/zero", "of=/written", "bs=1048576", fmt.Sprintf("count=%d", mib)); err != nil {
			return out, err
		}
		if err := b.waitStopped(ctx, id, 5*time.Minute); err != nil {
			return out, err
		}
		start := time.Now()
		if err := b.ctr(ctx, io.Discard, "task", "rm", id); err != nil {
			return out, err
		}
		out = append(out, ms(time.Since(start)))
		if err := b.checkWritten(ctx, id, int64(mib)<<20); err != nil {
			return out, fmt.Errorf("%s: %w", rt, err)
		}
		b.remove(id)
	}
	return out, nil
}

// waitStopped polls `ctr task ls` until task id is STOPPED.
func (b *ctrdBench) waitStopped(ctx context.Context, id string, timeout time.Duration) error {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(id) + `\s+\d+\s+STOPPED\s*$`)
	deadline := time.Now().Add(timeout)
	for {
		var ls strings.Builder
		if err := b.ctr(ctx, &ls, "task", "ls"); err != nil {
			return err
		}
		if re.MatchString(ls.String()) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("task %s not stopped after %s", id, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// checkWritten checks that container id's snapshot holds /written of size
// bytes in its upperdir.
func (b *ctrdBench) checkWritten(ctx context.Context, id string, size int64) error {
	var mounts strings.Builder
	if err := b.ctr(ctx, &mounts, "snapshots", "mounts", "/mnt", id); err != nil {
		return err
	}
	m := upperdirOption.FindStringSubmatch(mounts.String())
	if m == nil {
		return fmt.Errorf("no upperdir for snapshot %s in %q", id, mounts.String())
	}
	fi, err := os.Stat(filepath.Join(m[1], "written"))
	if err != nil {
		return fmt.Errorf("the container's write is not in its snapshot: %w", err)
	}
	if fi.Size() != size {
		return fmt.Errorf("the container wrote %d bytes, its snapshot holds %d", size, fi.Size())
	}
	return nil
}
