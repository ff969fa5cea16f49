//go:build linux

package agent

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/api"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCgroupMetrics(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"cgroup.procs":   "12\n13\n",
		"cpu.stat":       "usage_usec 1000\nuser_usec 600\nsystem_usec 400\nnr_periods 5\nnr_throttled 2\nthrottled_usec 77\n",
		"cpu.pressure":   "some avg10=1.50 avg60=0.25 avg300=0.00 total=12345\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=99\n",
		"memory.stat":    "anon 4096\nfile 8192\npgfault 10\nbogus line here\n",
		"memory.current": "12288\n",
		"memory.max":     "max\n",
		"memory.peak":    "20000\n",
		"memory.events":  "low 0\nhigh 1\nmax 2\noom 3\noom_kill 4\n",
		"pids.current":   "2\n",
		"pids.max":       "64\n",
		"io.stat":        "8:0 rbytes=100 wbytes=200 rios=3 wios=4 dbytes=0 dios=0\n254:16 rbytes=1 wbytes=2 rios=3 wios=4\n",
	})
	m, err := cgroupMetrics(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Pids.Current != 2 || m.Pids.Limit != 64 {
		t.Errorf("pids %v", m.Pids)
	}
	if c := m.CPU; c.UsageUsec != 1000 || c.UserUsec != 600 || c.SystemUsec != 400 || c.NrPeriods != 5 || c.NrThrottled != 2 || c.ThrottledUsec != 77 {
		t.Errorf("cpu %v", c)
	}
	if p := m.CPU.PSI; p == nil || p.Some.Avg10 != 1.5 || p.Some.Total != 12345 || p.Full.Total != 99 {
		t.Errorf("cpu psi %v", p)
	}
	if mem := m.Memory; mem.Anon != 4096 || mem.File != 8192 || mem.Pgfault != 10 || mem.Usage != 12288 || mem.UsageLimit != math.MaxUint64 || mem.MaxUsage != 20000 {
		t.Errorf("memory %v", mem)
	}
	if e := m.MemoryEvents; e == nil || e.High != 1 || e.Max != 2 || e.Oom != 3 || e.OomKill != 4 {
		t.Errorf("memory events %v", e)
	}
	if len(m.Io.Usage) != 2 || m.Io.Usage[0].Major != 8 || m.Io.Usage[0].Rbytes != 100 || m.Io.Usage[0].Wios != 4 || m.Io.Usage[1].Major != 254 || m.Io.Usage[1].Minor != 16 {
		t.Errorf("io %v", m.Io.Usage)
	}
	if _, err := marshalMetrics(m); err != nil {
		t.Fatal(err)
	}
	if _, err := cgroupMetrics(filepath.Join(dir, "gone")); !errdefs.IsNotFound(err) {
		t.Fatalf("missing cgroup: %v", err)
	}
}

func TestCgroupPids(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"cgroup.procs":         "30\n10\n",
		"a/cgroup.procs":       "20\n",
		"a/b/cgroup.procs":     "40\n10\n",
		"empty/cgroup.procs":   "",
		"notacgroup/somefile":  "x",
		"memory.events":        "oom_kill 0\n",
		"a/b/c/cgroup.procs":   "",
		"a/b/c/d/cgroup.procs": "50\n",
	})
	pids, err := cgroupPids(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint32{10, 20, 30, 40, 50}; !reflect.DeepEqual(pids, want) {
		t.Fatalf("got %v, want %v", pids, want)
	}
	if _, err := cgroupPids(filepath.Join(dir, "gone")); !errdefs.IsNotFound(err) {
		t.Fatalf("missing cgroup: %v", err)
	}
}

func TestEventQueue(t *testing.T) {
	ctx := context.Background()
	q := newEventQueue(3)
	for _, id := range []string{"a", "b", "c", "d"} {
		q.push(ctx, &api.Event{Kind: api.Event_OOM, ContainerId: id})
	}
	for _, want := range []string{"b", "c", "d"} {
		e, err := q.next(ctx)
		if err != nil || e.ContainerId != want {
			t.Fatalf("got %v %v, want %s (oldest dropped)", e, err, want)
		}
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		q.push(ctx, &api.Event{Kind: api.Event_OOM, ContainerId: "late"})
	}()
	if e, err := q.next(ctx); err != nil || e.ContainerId != "late" {
		t.Fatalf("long poll: %v %v", e, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := q.next(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled poll: %v", err)
	}
}

func TestOOMWatcher(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "memory.events")
	writeFiles(t, dir, map[string]string{"memory.events": "low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n"})
	reports := make(chan string, 10)
	w, err := newOOMWatcher(context.Background(), func(id string, _ uint64) { reports <- id })
	if err != nil {
		t.Fatal(err)
	}
	defer w.file.Close()
	wd, err := w.add("web", events)
	if err != nil {
		t.Fatal(err)
	}
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-reports:
			if got != want {
				t.Fatalf("report for %q, want %q", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no OOM report")
		}
	}
	none := func() {
		t.Helper()
		select {
		case got := <-reports:
			t.Fatalf("unexpected report for %q", got)
		case <-time.After(200 * time.Millisecond):
		}
	}
	// A change other than a kill (and the kill counted at add) is not an OOM.
	writeFiles(t, dir, map[string]string{"memory.events": "low 0\nhigh 5\nmax 3\noom 1\noom_kill 1\n"})
	none()
	writeFiles(t, dir, map[string]string{"memory.events": "low 0\nhigh 5\nmax 3\noom 2\noom_kill 2\n"})
	expect("web")
	writeFiles(t, dir, map[string]string{"memory.events": "low 0\nhigh 5\nmax 3\noom 2\noom_kill 4\n"})
	expect("web")
	w.remove(wd)
	writeFiles(t, dir, map[string]string{"memory.events": "oom_kill 9\n"})
	none()
	// A cgroup that goes away drops its watch by itself.
	wd, err = w.add("db", events)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(events); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		w.mu.Lock()
		_, ok := w.watches[wd]
		w.mu.Unlock()
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("watch of a removed file kept")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestGuestCgroupsPath(t *testing.T) {
	if p, err := guestCgroupsPath("c1", ""); err != nil || p != "/cocoon/c1" {
		t.Fatalf("default: %q %v", p, err)
	}
	if p, err := guestCgroupsPath("c1", "/pod/c1"); err != nil || p != "/pod/c1" {
		t.Fatalf("absolute: %q %v", p, err)
	}
	for _, bad := range []string{"relative/x", "/a/../b", "/", "system.slice:cri:c1", "/a/"} {
		if _, err := guestCgroupsPath("c1", bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: want invalid argument, got %v", bad, err)
		}
	}
}
