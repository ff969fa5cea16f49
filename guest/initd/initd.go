//go:build linux

// Package initd does cocoon-agent's duties as PID 1 before the agent
// serves: the kernel filesystems, a root that containers can pivot_root
// away from, cgroup v2 with every controller
// delegated, loopback up, the /dev links programs expect, kernel modules,
// and the agent's settings from the kernel command line. Each step is
// timed and tolerant of having run before (a filesystem already mounted is
// left alone), so init can be retried and the agent can run in a guest
// whose initramfs already did part of it.
//
// It also owns the end of the guest's life: PowerOff stops every process,
// syncs and unmounts, then powers the VM off.
package initd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// DefaultPath is PID 1's PATH: the kernel starts init without one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Step is one timed init duty.
type Step struct {
	// Name says what the step does.
	Name string
	// Duration is how long it took.
	Duration time.Duration
	// Err is why it failed; init goes on past failed optional steps.
	Err error
}

// Report is the outcome of Run.
type Report struct {
	// Cmdline is what the kernel command line asked for.
	Cmdline Cmdline
	// Steps in the order they ran.
	Steps []Step
	// Total is the time from Run's start to its end.
	Total time.Duration
}

// mountSpec is one filesystem init mounts.
type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
	mode                   os.FileMode
}

// mounts in order; later ones live under earlier ones.
var mounts = []mountSpec{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755", 0o755},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5", 0o755},
	{"shm", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755", 0o755},
	{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
	{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "nsdelegate", 0o555},
}

// devLinks are the /dev symlinks programs expect and devtmpfs lacks.
var devLinks = [][2]string{
	{"/dev/fd", "/proc/self/fd"},
	{"/dev/stdin", "/proc/self/fd/0"},
	{"/dev/stdout", "/proc/self/fd/1"},
	{"/dev/stderr", "/proc/self/fd/2"},
	{"/dev/core", "/proc/kcore"},
}

// Run does the init duties. Only the mounts that everything else needs
// are fatal; later steps log their failure in the report and init goes
// on, since a guest that answers is easier to debug than one that does
// not.
func Run(ctx context.Context) (*Report, error) {
	start := time.Now()
	rep := &Report{Cmdline: Cmdline{Channel: ChannelSerial}}
	step := func(name string, fn func() error) error {
		t := time.Now()
		err := fn()
		rep.Steps = append(rep.Steps, Step{Name: name, Duration: time.Since(t), Err: err})
		if err != nil {
			log.G(ctx).WithError(err).WithField("step", name).Warn("init step failed")
		}
		return err
	}
	defer func() { rep.Total = time.Since(start) }()

	_ = os.Setenv("PATH", DefaultPath)
	for i, m := range mounts {
		err := step("mount "+m.target, func() error { return mount(m) })
		if err != nil && m.target != "/sys/fs/cgroup" {
			return rep, err
		}
		if i == 0 {
			// With /proc mounted; failing only costs containers
			// pivot_root (the runtime falls back to chroot).
			_ = step("leave rootfs", leaveRootfs)
		}
	}
	_ = step("console", ensureConsole)
	_ = step("cmdline", func() error {
		b, err := os.ReadFile("/proc/cmdline")
		if err != nil {
			return err
		}
		c, err := ParseCmdline(string(b))
		rep.Cmdline = c
		return err
	})
	_ = step("dev links", devLinksStep)
	_ = step("cgroup controllers", enableControllers)
	_ = step("loopback", loopbackUp)
	_ = step("modules", func() error { return loadModules(ctx) })
	return rep, nil
}

// mount mounts m unless something is mounted there already.
func mount(m mountSpec) error {
	if err := os.MkdirAll(m.target, m.mode|0o700); err != nil {
		return fmt.Errorf("mkdir %s: %w", m.target, err)
	}
	if mounted, err := isMountpoint(m.target); err == nil && mounted {
		return nil
	}
	err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
	if errors.Is(err, unix.EBUSY) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
	}
	return nil
}

// isMountpoint compares the device of dir with its parent's: a mount
// point is the root of another filesystem. It works before /proc exists.
func isMountpoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// ensureConsole gives PID 1 stdio on /dev/console if the kernel could not
// (no /dev/console in the initramfs), so that errors reach the console log.
func ensureConsole() error {
	if _, err := unix.FcntlInt(1, unix.F_GETFD, 0); err == nil {
		return nil
	}
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return fmt.Errorf("open /dev/console: %w", err)
	}
	for i := 0; i < 3; i++ {
		if fd != i {
			if err := unix.Dup3(fd, i, 0); err != nil {
				return fmt.Errorf("dup console: %w", err)
			}
		}
	}
	if fd > 2 {
		_ = unix.Close(fd)
	}
	return nil
}

func devLinksStep() error {
	var errs []error
	// The pty multiplexer of the devpts instance mounted above; the
	// devtmpfs node would point at the kernel's initial instance.
	if fi, err := os.Lstat("/dev/ptmx"); err == nil && fi.Mode()&os.ModeSymlink == 0 {
		if err := os.Remove("/dev/ptmx"); err != nil {
			errs = append(errs, err)
		}
	}
	links := append([][2]string{{"/dev/ptmx", "pts/ptmx"}}, devLinks...)
	for _, l := range links {
		if err := os.Symlink(l[1], l[0]); err != nil && !errors.Is(err, os.ErrExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// enableControllers delegates every available cgroup v2 controller to the
// root's children, where the OCI runtime puts containers.
func enableControllers() error {
	b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		return err
	}
	ctrls := strings.Fields(string(b))
	if len(ctrls) == 0 {
		return nil
	}
	all := "+" + strings.Join(ctrls, " +")
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte(all), 0); err == nil {
		return nil
	}
	// One refused controller fails the whole write; enable the others.
	var errs []error
	for _, c := range ctrls {
		if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+"+c), 0); err != nil {
			errs = append(errs, fmt.Errorf("enable %s: %w", c, err))
		}
	}
	return errors.Join(errs...)
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	flags := ifr.Uint16()
	if flags&unix.IFF_UP != 0 {
		return nil
	}
	ifr.SetUint16(flags | unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

// loadModules loads the modules in ModulesFile, in order. A missing file
// means the kernel has what it needs built in.
func loadModules(ctx context.Context) error {
	f, err := os.Open(ModulesFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	mods, err := ParseModules(f)
	f.Close()
	if err != nil {
		return err
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return err
	}
	dir := filepath.Join("/lib/modules", unix.ByteSliceToString(uts.Release[:]))
	var errs []error
	for _, m := range mods {
		if err := loadModule(filepath.Join(dir, m)); err != nil {
			errs = append(errs, err)
			continue
		}
		log.G(ctx).WithField("module", m).Debug("module loaded")
	}
	return errors.Join(errs...)
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	flags := 0
	if compressedModule(path) {
		flags |= unix.MODULE_INIT_COMPRESSED_FILE
	}
	err = unix.FinitModule(int(f.Fd()), "", flags)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load module %s: %w", path, err)
	}
	return nil
}
