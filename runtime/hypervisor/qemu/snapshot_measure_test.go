package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// The measurements behind docs/snapshots.md. Set COCOON_MEASURE=1 to run
// them; they boot several guests of 256 MiB and 1 GiB.

func needMeasure(t *testing.T) {
	if os.Getenv("COCOON_MEASURE") == "" {
		t.Skip("measurement: set COCOON_MEASURE=1")
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestMeasureSnapshot times pause + save, the state's size against the
// guest RAM touched, and restores to a running guest and to an agent
// answer, for an idle guest of 256 MiB and of 1 GiB.
func TestMeasureSnapshot(t *testing.T) {
	needMeasure(t)
	const rounds = 5
	for _, mem := range []int{256, 1024} {
		t.Run(fmt.Sprint(mem, "MiB"), func(t *testing.T) {
			spec := agentSpec(t, mem)
			vm := launchForTest(t, spec)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
			defer cancel()
			connectAgent(t, ctx, vm)
			touched := guestTouchedKiB(t, vm.PID(), mem)
			dir := t.TempDir()
			var saves []time.Duration
			var state string
			var size int64
			for i := range rounds {
				state = filepath.Join(dir, fmt.Sprint(i, ".state"))
				saved, took := saveTo(t, ctx, vm, state)
				saves = append(saves, took)
				size = saved.Bytes
				if err := vm.Resume(ctx); err != nil {
					t.Fatal(err)
				}
			}
			vm.Stop(ctx)
			t.Logf("%d MiB: pause+save median %v (%v); state %d KiB; guest RAM touched %d KiB",
				mem, median(saves).Round(time.Millisecond), saves, size>>10, touched)

			var running, answered []time.Duration
			for range rounds {
				start := time.Now()
				restored, took := restoreFrom(t, spec, state, nil)
				connectAgent(t, ctx, restored)
				answered = append(answered, time.Since(start))
				running = append(running, took)
				rt := guestTouchedKiB(t, restored.PID(), mem)
				restored.Stop(ctx)
				t.Logf("restore: running %v, agent %v, guest RAM in the new qemu %d KiB",
					took.Round(time.Millisecond), answered[len(answered)-1].Round(time.Millisecond), rt)
			}
			t.Logf("%d MiB: restore to running median %v; to an agent answer median %v (%v)",
				mem, median(running).Round(time.Millisecond), median(answered).Round(time.Millisecond), answered)
		})
	}
}

// allocatedKiB is how much of path is allocated on disk.
func allocatedKiB(t *testing.T, path string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks / 2
}
