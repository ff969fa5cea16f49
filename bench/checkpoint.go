package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
	"github.com/cocoonrt/cocoon/runtime/config"
)

// checkpointMiB are the guest memory sizes checkpointed, with the same
// workload: restore must not grow with the nominal size.
var checkpointMiB = []int{256, 1024}

// checkpointSamples is how many checkpoints and restores each size gets.
const checkpointSamples = 3

// checkpointWorkload touches 32 MiB of memory (a tmpfs file) and writes
// 4 MiB to the container's root, then idles.
const checkpointWorkload = `head -c 33554432 /dev/urandom > /dev/shm/mem && head -c 4194304 /dev/urandom > /data && echo ready > /ready && exec sleep 3600`

// ckptFigures are, per memory size (index into checkpointMiB), at [0]
// Cocoon and [1] runc (CRIU).
type ckptFigures struct {
	// checkpoint is `ctr container checkpoint --task` in ms; restore is
	// `ctr container restore --live` in ms, until the task runs.
	checkpoint, restore [2][][]float64
	// shimRestore is the restore inside Cocoon's shim (its "restore
	// timing" line): verify, disks, VM load, agent, stdio.
	shimRestore [][]float64
	// image is the checkpoint blob in the content store, and used the
	// guest RAM QEMU had touched plus the scratch disk's used blocks, in
	// MiB (Cocoon only).
	image, used [][]float64
	// runcErr says why runc's figures are missing, if they are.
	runcErr error
}

// checkpointFigures measures both runtimes' checkpoints and restores.
func (b *ctrdBench) checkpointFigures(ctx context.Context) (f ckptFigures, err error) {
	for range checkpointMiB {
		f.checkpoint[0], f.checkpoint[1] = append(f.checkpoint[0], nil), append(f.checkpoint[1], nil)
		f.restore[0], f.restore[1] = append(f.restore[0], nil), append(f.restore[1], nil)
		f.image, f.used = append(f.image, nil), append(f.used, nil)
		f.shimRestore = append(f.shimRestore, nil)
	}
	for k, mib := range checkpointMiB {
		for i := 0; i < checkpointSamples; i++ {
			s, err := b.checkpointOnce(ctx, runtimeCocoon, mib)
			if err != nil {
				return f, err
			}
			f.checkpoint[0][k] = append(f.checkpoint[0][k], s.checkpoint)
			f.restore[0][k] = append(f.restore[0][k], s.restore)
			f.image[k] = append(f.image[k], s.image)
			f.used[k] = append(f.used[k], s.used)
			f.shimRestore[k] = append(f.shimRestore[k], s.shimRestore)
			if f.runcErr != nil {
				continue
			}
			r, err := b.checkpointOnce(ctx, runtimeRunc, mib)
			if err != nil {
				f.runcErr = err
				continue
			}
			f.checkpoint[1][k] = append(f.checkpoint[1][k], r.checkpoint)
			f.restore[1][k] = append(f.restore[1][k], r.restore)
		}
	}
	return f, nil
}

type ckptSample struct {
	checkpoint, restore, shimRestore, image, used float64
}

// checkpointOnce runs the workload in a new container of runtime rt
// (guest memory mib for Cocoon), checkpoints it, removes it and restores
// it, and removes what it made.
func (b *ctrdBench) checkpointOnce(ctx context.Context, rt string, mib int) (s ckptSample, retErr error) {
	id := b.newID("ckpt")
	ref := "bench/checkpoint:" + id
	defer func() {
		b.remove(id)
		_ = b.ctr(context.Background(), io.Discard, "image", "rm", ref)
	}()
	if err := b.ctr(ctx, io.Discard, "run", "-d", "--runtime", rt, "--annotation", fmt.Sprintf("io.cocoon.memory_mib=%d", mib), b.image, id, "sh", "-c", checkpointWorkload); err != nil {
		return s, err
	}
	if err := b.waitFile(ctx, id, "/ready"); err != nil {
		return s, err
	}
	if rt == runtimeCocoon {
		used, err := b.usedMiB(id, mib)
		if err != nil {
			return s, err
		}
		s.used = used
	}
	began := time.Now()
	if err := b.ctr(ctx, io.Discard, "container", "checkpoint", "--task", id, ref); err != nil {
		return s, err
	}
	s.checkpoint = ms(time.Since(began))
	if rt == runtimeCocoon {
		size, err := b.checkpointBlobMiB(ref)
		if err != nil {
			return s, err
		}
		s.image = size
	}
	b.remove(id)
	b.live[id] = true
	began = time.Now()
	if err := b.ctr(ctx, io.Discard, "container", "restore", "--live", id, ref); err != nil {
		return s, err
	}
	s.restore = ms(time.Since(began))
	// It runs, with what it had.
	if err := b.waitFile(ctx, id, "/ready"); err != nil {
		return s, fmt.Errorf("restored %s: %w", id, err)
	}
	if rt == runtimeCocoon {
		ms, err := b.restoreTiming(id)
		if err != nil {
			return s, err
		}
		s.shimRestore = ms
	}
	return s, nil
}

var restoreLine = regexp.MustCompile(`msg="restore timing"(.*)`)

// restoreTiming reads the shim's account of sandbox id's restore from
// containerd's log.
func (b *ctrdBench) restoreTiming(id string) (float64, error) {
	for wait := 0; wait < 20; wait++ {
		for _, line := range strings.Split(b.c.Log(), "\n") {
			m := restoreLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			f := map[string]string{}
			for _, kv := range timingField.FindAllStringSubmatch(m[1], -1) {
				f[kv[1]] = strings.Trim(kv[2], `"`)
			}
			if f["sandbox"] == id {
				return strconv.ParseFloat(f["total_ms"], 64)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("containerd's log has no restore timing of %s", id)
}

// waitFile waits until container id has file.
func (b *ctrdBench) waitFile(ctx context.Context, id, file string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for n := 0; ; n++ {
		err := b.ctr(ctx, io.Discard, "task", "exec", "--exec-id", fmt.Sprintf("wait-%d", n), id, "test", "-e", file)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s has no %s: %w", id, file, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// usedMiB is the guest RAM QEMU has touched plus the used blocks of the
// scratch disk of container id, Cocoon's only running container.
func (b *ctrdBench) usedMiB(id string, mib int) (float64, error) {
	shims := harness.ShimPIDsOf(harness.ShimBinary, b.c.Address)
	if len(shims) != 1 {
		return 0, fmt.Errorf("%d cocoon shims running, want 1", len(shims))
	}
	var ram float64
	for _, pid := range descendants(shims[0]) {
		if strings.HasPrefix(comm(pid), "qemu-system") {
			q, err := qemuMemory(pid, mib)
			if err != nil {
				return 0, err
			}
			ram = q.ramAnon
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(b.vmDataDir, id, id, "scratch.ext4"), &st); err != nil {
		return 0, fmt.Errorf("scratch disk of %s: %w", id, err)
	}
	return ram + float64(st.Blocks*512)/(1<<20), nil
}

// checkpointBlobMiB is the size of checkpoint image ref's checkpoint
// blob in the content store.
func (b *ctrdBench) checkpointBlobMiB(ref string) (float64, error) {
	_, size, err := b.c.CheckpointBlob(ref)
	return float64(size) / (1 << 20), err
}

// checkpointResults are the checkpoint figures, Cocoon next to runc.
func checkpointResults(f ckptFigures) []Result {
	var out []Result
	for k, mib := range checkpointMiB {
		pair := func(name string, s [2][][]float64, target string) Result {
			r := Result{Name: fmt.Sprintf(name, mib), Unit: "ms", Median: median(s[0][k]), Samples: s[0][k], Target: target}
			if f.runcErr == nil && len(s[1][k]) > 0 {
				m := median(s[1][k])
				r.Runc, r.RuncSamples = &m, s[1][k]
			}
			return r
		}
		restoreTarget := "<= 500 ms"
		if k > 0 {
			restoreTarget = fmt.Sprintf("<= 1.3x the %d MiB guest's", checkpointMiB[0])
		}
		out = append(out,
			pair("ctr container checkpoint --task, %d MiB guest", f.checkpoint, ""),
			pair("ctr container restore --live, %d MiB guest", f.restore, ""),
			Result{Name: "  of which the shim's restore to a running guest", Unit: "ms", Median: median(f.shimRestore[k]), Samples: f.shimRestore[k],
				Target: restoreTarget},
			Result{Name: fmt.Sprintf("  checkpoint blob in the content store, %d MiB guest", mib), Unit: "MiB", Median: median(f.image[k]), Samples: f.image[k],
				Target: "<= touched memory + scratch + 10%"},
			Result{Name: "  guest memory touched + scratch blocks used", Unit: "MiB", Median: median(f.used[k]), Samples: f.used[k]},
		)
	}
	return out
}

// benchCheckpointOnly measures only the checkpoint figures.
func benchCheckpointOnly(ctx context.Context, cfg *config.Config) (f ckptFigures, retErr error) {
	b, err := startCtrd(cfg.Runtime.StateDir, cfg.Runtime.DataDir)
	if err != nil {
		return f, err
	}
	defer b.close()
	return b.checkpointFigures(ctx)
}
