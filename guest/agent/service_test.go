//go:build linux

package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/agent/reaper"
	"github.com/cocoonrt/cocoon/guest/api"
)

type nopSystem struct{}

func (nopSystem) SetWallClock(time.Time) error { return nil }
func (nopSystem) AddEntropy([]byte) error      { return nil }
func (nopSystem) SetHostname(string) error     { return nil }
func (nopSystem) PowerOff() error              { return nil }

func newService(t *testing.T, cfg Config) *Service {
	t.Helper()
	r := reaper.New(reaper.Options{})
	t.Cleanup(r.Close)
	cfg.System, cfg.Reaper = nopSystem{}, r
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestValidateStart(t *testing.T) {
	ok := &api.StartProcessRequest{Id: "a", Args: []string{"true"}}
	if err := validateStart(ok); err != nil {
		t.Fatal(err)
	}
	bad := map[string]*api.StartProcessRequest{
		"bad id":          {Id: "a b", Args: []string{"true"}},
		"no args":         {Id: "a"},
		"empty program":   {Id: "a", Args: []string{""}},
		"nul in arg":      {Id: "a", Args: []string{"echo", "a\x00b"}},
		"nul in env":      {Id: "a", Args: []string{"true"}, Env: []string{"A=\x00"}},
		"relative cwd":    {Id: "a", Args: []string{"true"}, Cwd: "tmp"},
		"too many args":   {Id: "a", Args: make([]string, maxArgs+1)},
		"too large":       {Id: "a", Args: []string{"true", strings.Repeat("x", maxArgvBytes)}},
		"tty with stderr": {Id: "a", Args: []string{"true"}, Terminal: true, Stderr: true},
		"huge terminal":   {Id: "a", Args: []string{"true"}, Terminal: true, Width: 70000},
	}
	for name, req := range bad {
		if name == "too many args" {
			req.Args[0] = "true"
		}
		if err := validateStart(req); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: want invalid argument, got %v", name, err)
		}
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "prog")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/nonexistent:" + dir}
	if p, err := lookPath("prog", env); err != nil || p != exe {
		t.Fatalf("got %q %v", p, err)
	}
	if _, err := lookPath("data", env); !errdefs.IsNotFound(err) {
		t.Fatalf("non-executable: want not found, got %v", err)
	}
	if p, err := lookPath("./x/y", env); err != nil || p != "./x/y" {
		t.Fatalf("path with slash: %q %v", p, err)
	}
	if got := withDefaultPath([]string{"A=1"}); got[len(got)-1] != DefaultPath {
		t.Fatalf("default PATH not added: %v", got)
	}
	if got := withDefaultPath(env); len(got) != 1 {
		t.Fatalf("PATH added twice: %v", got)
	}
}

func TestLimits(t *testing.T) {
	s := newService(t, Config{MaxProcesses: 1, StreamTimeout: 50 * time.Millisecond})
	ctx := context.Background()
	if _, err := s.StartProcess(ctx, &api.StartProcessRequest{Id: "one", Args: []string{"sleep", "100"}}); err != nil {
		t.Fatal(err)
	}
	_, err := s.StartProcess(ctx, &api.StartProcessRequest{Id: "two", Args: []string{"true"}})
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("want resource exhausted, got %v", err)
	}
	if _, err := s.SignalProcess(ctx, &api.SignalProcessRequest{Id: "one", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.WaitProcess(ctx, &api.WaitProcessRequest{Id: "one"})
	if err != nil || resp.ExitStatus != 137 {
		t.Fatalf("got %v %v", resp, err)
	}
	// Waited for: forgotten, and the slot is free.
	if _, err := s.WaitProcess(ctx, &api.WaitProcessRequest{Id: "one"}); !errdefs.IsNotFound(err) {
		t.Fatalf("want not found, got %v", err)
	}
	// A stream that never comes fails the start and frees the id.
	_, err = s.StartProcess(ctx, &api.StartProcessRequest{Id: "two", Args: []string{"true"}, Stdout: true})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("want failed precondition, got %v", err)
	}
	if _, err := s.StartProcess(ctx, &api.StartProcessRequest{Id: "two", Args: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SignalProcess(ctx, &api.SignalProcessRequest{Id: "two", Signal: 0}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("signal 0: want invalid argument, got %v", err)
	}
}

func TestUidGid(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	s := newService(t, Config{})
	ctx := context.Background()
	if _, err := s.StartProcess(ctx, &api.StartProcessRequest{Id: "u", Args: []string{"sh", "-c", `test "$(id -u):$(id -g):$(id -G)" = "1234:5678:5678"`}, Uid: 1234, Gid: 5678}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.WaitProcess(ctx, &api.WaitProcessRequest{Id: "u"})
	if err != nil || resp.ExitStatus != 0 {
		t.Fatalf("got %v %v", resp, err)
	}
}

func TestSyncGuestBounds(t *testing.T) {
	s := newService(t, Config{})
	ctx := context.Background()
	for name, req := range map[string]*api.SyncGuestRequest{
		"entropy":  {Entropy: make([]byte, MaxEntropy+1)},
		"hostname": {Hostname: strings.Repeat("h", maxHostname+1)},
		"nul":      {Hostname: "a\x00b"},
		"time":     {WallTimeUnixNs: -1},
	} {
		if _, err := s.SyncGuest(ctx, req); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: want invalid argument, got %v", name, err)
		}
	}
}

func TestFindSerialPort(t *testing.T) {
	dir := t.TempDir()
	for port, name := range map[string]string{"vport0p1": "org.qemu.guest_agent.0", "vport1p1": "io.cocoon.agent.0\n"} {
		if err := os.MkdirAll(filepath.Join(dir, port), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, port, "name"), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := FindSerialPort(dir, "io.cocoon.agent.0"); err != nil || p != "/dev/vport1p1" {
		t.Fatalf("got %q %v", p, err)
	}
	if _, err := FindSerialPort(dir, "missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("want not exist, got %v", err)
	}
}
