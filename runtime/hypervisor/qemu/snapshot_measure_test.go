package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/runtime/agent"
	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu/qmp"
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

// fileQEMU is a QEMU run by the measurement below with guest RAM in a
// file, outside the driver (which does not offer it).
type fileQEMU struct {
	cmd  *exec.Cmd
	qmp  *qmp.Client
	dir  string
	done chan struct{}
}

// startFileBacked starts the driver's command line for spec with guest
// RAM as memory-backend-file on memPath (share=on: the guest writes the
// file; share=off: a private copy-on-write mapping of it), plus extra.
func startFileBacked(t *testing.T, spec hypervisor.Spec, memPath string, share bool, extra ...string) *fileQEMU {
	t.Helper()
	khz, _ := localTSC().hostTSCKHz()
	args := commandLine(launchParams{spec: spec, tbSizeMiB: DefaultTBSizeMiB, tscKHz: khz})
	i := slices.Index(args, "-M")
	args[i+1] += ",memory-backend=mem"
	shareArg := "off"
	if share {
		shareArg = "on"
	}
	args = append(args, "-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s", spec.MemoryMiB, memPath, shareArg))
	args = append(args, extra...)
	cmd := exec.Command(DefaultBinary, args...)
	cmd.Dir = spec.StateDir
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	q := &fileQEMU{cmd: cmd, dir: spec.StateDir, done: make(chan struct{})}
	go func() { cmd.Wait(); close(q.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-q.done
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		c, err := dialQMP(ctx, filepath.Join(spec.StateDir, QMPSocketName))
		if err == nil {
			q.qmp = c
			t.Cleanup(func() { c.Close() })
			return q
		}
		if ctx.Err() != nil {
			t.Fatalf("qmp: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (q *fileQEMU) exec(t *testing.T, ctx context.Context, cmd string, args any) {
	t.Helper()
	if err := q.qmp.Execute(ctx, cmd, args, nil); err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
}

// waitMigrated polls query-migrate until the migration ends.
func (q *fileQEMU) waitMigrated(t *testing.T, ctx context.Context) {
	t.Helper()
	for {
		var info migrationInfo
		if err := q.qmp.Execute(ctx, "query-migrate", nil, &info); err != nil {
			t.Fatal(err)
		}
		if done, err := migrationDone(info); done {
			if err != nil {
				t.Fatal(err)
			}
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// agent opens one agent session on q's guest and waits for its answer.
func (q *fileQEMU) agent(t *testing.T, ctx context.Context) agent.GuestInfo {
	t.Helper()
	ep := channel.Endpoint{Kind: channel.Serial, SocketPath: filepath.Join(q.dir, AgentSocketName)}
	_, info := agentOn(t, ctx, ep, nil)
	return info
}

// allocatedKiB is how much of path is allocated on disk.
func allocatedKiB(t *testing.T, path string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks / 2
}

// TestMeasureFileBackedMemory measures the other route: guest RAM in a
// shared file, x-ignore-shared so the migration stream holds only device
// state, the file copied while paused (a checkpoint of a VM that runs on
// must freeze the memory it keeps writing), and restores that map the
// copy privately (copy-on-write) and fault pages in as the guest touches
// them.
func TestMeasureFileBackedMemory(t *testing.T) {
	needMeasure(t)
	const rounds = 5
	for _, mem := range []int{256, 1024} {
		t.Run(fmt.Sprint(mem, "MiB"), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
			defer cancel()
			spec := agentSpec(t, mem)
			dir := t.TempDir()
			memFile := filepath.Join(dir, "mem")
			src := startFileBacked(t, spec, memFile, true)
			src.agent(t, ctx)

			caps := []map[string]any{{"capability": "x-ignore-shared", "state": true}}
			src.exec(t, ctx, "migrate-set-capabilities", map[string]any{"capabilities": caps})
			src.exec(t, ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": saveBandwidth, "downtime-limit": saveDowntimeMs})
			state := filepath.Join(dir, "state")
			f, err := os.Create(state)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			src.exec(t, ctx, "stop", nil)
			if err := src.qmp.SendFile(ctx, "s", f); err != nil {
				t.Fatal(err)
			}
			src.exec(t, ctx, "migrate", map[string]any{"uri": "fd:s"})
			src.waitMigrated(t, ctx)
			saved := time.Since(start)
			f.Close()
			// The checkpoint keeps a copy of the memory as it is now:
			// the file is the running guest's RAM.
			snap := filepath.Join(dir, "mem.snap")
			cstart := time.Now()
			if out, err := exec.Command("cp", "--sparse=always", memFile, snap).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v %s", err, out)
			}
			copied := time.Since(cstart)
			fi, _ := os.Stat(state)
			t.Logf("%d MiB: pause+save (device state only) %v, state %d KiB; memory file copy %v, %d KiB allocated of %d KiB",
				mem, saved.Round(time.Millisecond), fi.Size()>>10, copied.Round(time.Millisecond), allocatedKiB(t, snap), int64(mem)<<10)
			src.exec(t, ctx, "quit", nil)
			<-src.done

			var running, answered []time.Duration
			for range rounds {
				s := spec
				s.StateDir = t.TempDir()
				start := time.Now()
				dst := startFileBacked(t, s, snap, false, "-S", "-incoming", "defer")
				dst.exec(t, ctx, "migrate-set-capabilities", map[string]any{"capabilities": caps})
				sf, err := os.Open(state)
				if err != nil {
					t.Fatal(err)
				}
				if err := dst.qmp.SendFile(ctx, "r", sf); err != nil {
					t.Fatal(err)
				}
				sf.Close()
				dst.exec(t, ctx, "migrate-incoming", map[string]any{"uri": "fd:r"})
				dst.waitMigrated(t, ctx)
				dst.exec(t, ctx, "cont", nil)
				running = append(running, time.Since(start))
				dst.agent(t, ctx)
				answered = append(answered, time.Since(start))
				rss := rssKiB(t, dst.cmd.Process.Pid)
				dst.exec(t, ctx, "quit", nil)
				<-dst.done
				t.Logf("restore: running %v, agent %v, qemu rss %d KiB",
					running[len(running)-1].Round(time.Millisecond), answered[len(answered)-1].Round(time.Millisecond), rss)
			}
			t.Logf("%d MiB: restore to running median %v; to an agent answer median %v",
				mem, median(running).Round(time.Millisecond), median(answered).Round(time.Millisecond))
		})
	}
}

func rssKiB(t *testing.T, pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}
