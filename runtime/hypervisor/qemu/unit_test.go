package qemu

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

func TestParseCPUInfoTSC(t *testing.T) {
	const amd = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu MHz\t\t: 2596.094\nflags\t\t: fpu tsc constant_tsc nonstop_tsc\n\nprocessor\t: 1\ncpu MHz\t\t: 1200.000\nflags\t\t: fpu tsc constant_tsc\n"
	for _, tc := range []struct {
		name    string
		in      string
		want    uint64
		wantErr string
	}{
		{"first processor", amd, 2596094, ""},
		{"integer MHz", "cpu MHz : 3000\nflags : constant_tsc\n", 3000000, ""},
		{"one decimal", "cpu MHz : 2400.5\nflags : constant_tsc\n", 2400500, ""},
		{"extra decimals are cut", "cpu MHz : 2400.12345\nflags : constant_tsc\n", 2400123, ""},
		{"no constant_tsc", "cpu MHz : 2400.000\nflags : fpu tsc\n", 0, "constant_tsc"},
		{"no MHz", "flags : constant_tsc\n", 0, "cpu MHz"},
		{"garbage MHz", "cpu MHz : fast\nflags : constant_tsc\n", 0, "fast"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCPUInfoTSC([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("= %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestHostTSCPrefersSysfs(t *testing.T) {
	dir := t.TempDir()
	sysfs := filepath.Join(dir, "tsc_freq_khz")
	cpuinfo := filepath.Join(dir, "cpuinfo")
	os.WriteFile(cpuinfo, []byte("cpu MHz : 1000.000\nflags : constant_tsc\n"), 0o644)
	src := tscSource{sysfs: sysfs, cpuinfo: cpuinfo}
	if got, err := src.hostTSCKHz(); err != nil || got != 1000000 {
		t.Fatalf("without sysfs = %d, %v", got, err)
	}
	os.WriteFile(sysfs, []byte("2099998\n"), 0o644)
	if got, err := src.hostTSCKHz(); err != nil || got != 2099998 {
		t.Fatalf("with sysfs = %d, %v", got, err)
	}
	// On this machine, whatever it is, the real sources must give a
	// plausible rate or a reason.
	if khz, err := localTSC().hostTSCKHz(); err != nil {
		t.Logf("host tsc rate unknown here: %v", err)
	} else if khz < 100000 || khz > 10000000 {
		t.Errorf("host tsc rate %d kHz is implausible", khz)
	} else {
		t.Logf("host tsc rate %d kHz", khz)
	}
}

func TestRingTail(t *testing.T) {
	r := newRing(32)
	if got := r.Tail(5); got != nil {
		t.Fatalf("empty ring tail = %q", got)
	}
	r.Write([]byte("one\r\ntwo\n\x1b[1mthree\x07"))
	if got := strings.Join(r.Tail(5), "|"); got != "one|two|[1mthree" {
		t.Fatalf("tail = %q", got)
	}
	if got := strings.Join(r.Tail(2), "|"); got != "two|[1mthree" {
		t.Fatalf("tail(2) = %q", got)
	}
	// Overflow: the partial first line is left out.
	r.Write([]byte("\nfour\nfive-is-a-longer-line\n"))
	if got := strings.Join(r.Tail(10), "|"); got != "four|five-is-a-longer-line" {
		t.Fatalf("after overflow = %q", got)
	}
	// A single write larger than the ring keeps its end.
	r.Write([]byte(strings.Repeat("x", 100) + "\nlast line\n"))
	if got := strings.Join(r.Tail(10), "|"); got != "last line" {
		t.Fatalf("after huge write = %q", got)
	}
	r.Write([]byte("bad \xff utf8\n"))
	if got := r.Tail(1)[0]; got != "bad \uFFFD utf8" {
		t.Fatalf("invalid utf8 = %q", got)
	}
}

func TestCappedLog(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  int64
		writes []string
		want   string
	}{
		{"under the cap", 100, []string{"hello\n", "world\n"}, "hello\nworld\n"},
		{"cut at the cap", 40, []string{"0123456789", "0123456789", "0123456789"}, "012345678901234" + consoleTruncated},
		{"nothing after the marker", 40, []string{strings.Repeat("a", 50), "more"}, strings.Repeat("a", 15) + consoleTruncated},
		{"cap smaller than the marker", 5, []string{"abc"}, consoleTruncated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "console.log")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			l := &cappedLog{f: f, limit: tc.limit}
			for _, w := range tc.writes {
				if n, err := l.Write([]byte(w)); err != nil || n != len(w) {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			f.Close()
			got, _ := os.ReadFile(path)
			if string(got) != tc.want {
				t.Fatalf("log = %q, want %q", got, tc.want)
			}
			if tc.limit >= int64(len(consoleTruncated)) && int64(len(got)) > tc.limit {
				t.Fatalf("log is %d bytes, over its cap %d", len(got), tc.limit)
			}
		})
	}
}

func TestValidateSpec(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinux")
	os.WriteFile(kernel, append([]byte("\x7fELF"), make([]byte, 100)...), 0o644)
	bz := make([]byte, 0x300)
	copy(bz[0x202:], "HdrS")
	bzImage := filepath.Join(dir, "bzImage")
	os.WriteFile(bzImage, bz, 0o644)
	junk := filepath.Join(dir, "junk")
	os.WriteFile(junk, make([]byte, 0x300), 0o644)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o644)
	good := hypervisor.Spec{ID: "x", StateDir: dir, Kernel: kernel, VCPUs: 1, MemoryMiB: 256,
		Accel: hypervisor.AccelTCG, Channel: channel.Serial}
	if err := validateSpec(good); err != nil {
		t.Fatalf("good spec: %v", err)
	}
	// containerd's longest namespace and id: the sockets are bound
	// relative to the state dir, so its length does not matter.
	long := good
	long.StateDir = filepath.Join(dir, strings.Repeat("n", 76), strings.Repeat("i", 76))
	if err := os.MkdirAll(long.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := validateSpec(long); err != nil {
		t.Fatalf("long state dir: %v", err)
	}
	withBz := good
	withBz.Kernel = bzImage
	if err := validateSpec(withBz); err != nil {
		t.Fatalf("bzImage kernel: %v", err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*hypervisor.Spec)
		want   string
	}{
		{"missing kernel", func(s *hypervisor.Spec) { s.Kernel = "/nonexistent/vmlinux" }, "guest kernel /nonexistent/vmlinux: no such file or directory"},
		{"empty kernel", func(s *hypervisor.Spec) { s.Kernel = empty }, "not a non-empty regular file"},
		{"kernel of no known format", func(s *hypervisor.Spec) { s.Kernel = junk }, "neither an ELF vmlinux nor a bzImage"},
		{"kernel is a dir", func(s *hypervisor.Spec) { s.Kernel = dir }, "not a non-empty regular file"},
		{"missing initrd", func(s *hypervisor.Spec) { s.Initrd = "/nonexistent/initrd" }, "guest initrd /nonexistent/initrd"},
		{"relative state dir", func(s *hypervisor.Spec) { s.StateDir = "run/x" }, "not an absolute path"},
		{"no vcpus", func(s *hypervisor.Spec) { s.VCPUs = 0 }, "vcpus = 0"},
		{"tiny memory", func(s *hypervisor.Spec) { s.MemoryMiB = 16 }, "memory = 16 MiB"},
		{"auto accel", func(s *hypervisor.Spec) { s.Accel = hypervisor.AccelAuto }, "not resolved"},
		{"auto channel", func(s *hypervisor.Spec) { s.Channel = channel.Auto }, "not resolved"},
		{"newline in kernel arg", func(s *hypervisor.Spec) { s.KernelArgs = []string{"a\nb"} }, "control characters"},
		{"huge cmdline", func(s *hypervisor.Spec) { s.KernelArgs = []string{strings.Repeat("x", 2100)} }, "kernel command line"},
		{"relative memory file", func(s *hypervisor.Spec) { s.Memory = &hypervisor.MemoryFile{Path: "mem", Shared: true} }, "memory file \"mem\" is not an absolute path"},
		{"missing clone memory", func(s *hypervisor.Spec) { s.Memory = &hypervisor.MemoryFile{Path: "/nonexistent/mem"} }, "memory file /nonexistent/mem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good
			tc.mutate(&s)
			err := validateSpec(s)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalidArgument mentioning %q", err, tc.want)
			}
		})
	}
}
