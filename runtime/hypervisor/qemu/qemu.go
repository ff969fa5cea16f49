// Package qemu is the hypervisor driver that runs each guest in its own
// qemu-system-x86_64 process with the microvm machine type.
//
// The QEMU process is a child of the caller but lives in its own process
// group and is not tied to the caller's life (no parent-death signal): a
// crashed shim must not take the guest with it, and `shim delete` finds the
// process again through the pid file with Cleanup.
//
// Files in the state dir: qmp.sock, agent.sock (serial channel), qemu.pid
// and console.log; with a share, virtiofs.sock, virtiofsd.pid and
// virtiofsd.log too. Stop and Cleanup remove all but the logs, which are
// bounded and kept for post-mortems until the state dir's owner removes the
// directory. A failed Launch removes them all. QEMU runs in the state dir
// and binds its sockets there by name, so no socket path depends on how
// long the state dir's path is, and nothing lives outside it.
package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu/qmp"
	"github.com/cocoonrt/cocoon/runtime/network"
)

// DriverName is the driver's name in the configuration.
const DriverName = "qemu"

// DefaultBinary is the QEMU executable looked up on PATH.
const DefaultBinary = "qemu-system-x86_64"

// Config tunes the driver. The zero value is usable.
type Config struct {
	// Binary is the QEMU executable, a path or a name looked up on PATH;
	// empty means DefaultBinary.
	Binary string
	// TBSizeMiB is TCG's translation cache size in MiB; 0 means
	// DefaultTBSizeMiB. Ignored under KVM.
	TBSizeMiB int
	// Virtiofsd is the file server of Spec.Share, a path or a name
	// looked up on PATH; empty means DefaultVirtiofsd. Only a spec with
	// a share needs it.
	Virtiofsd string
}

// Driver launches guests with QEMU.
type Driver struct {
	cfg Config
	// tsc says where the host TSC rate is read.
	tsc tscSource
	// nextCID draws vsock guest CIDs.
	nextCID func() uint32
	// vhostNet is the vhost-net device, DefaultVhostNetDevice.
	vhostNet string
}

var _ hypervisor.Driver = (*Driver)(nil)

// New returns a QEMU driver.
func New(cfg Config) *Driver {
	if cfg.Binary == "" {
		cfg.Binary = DefaultBinary
	}
	if cfg.TBSizeMiB <= 0 {
		cfg.TBSizeMiB = DefaultTBSizeMiB
	}
	if cfg.Virtiofsd == "" {
		cfg.Virtiofsd = DefaultVirtiofsd
	}
	return &Driver{cfg: cfg, tsc: localTSC(), nextCID: randomCID, vhostNet: DefaultVhostNetDevice}
}

// Name returns "qemu".
func (d *Driver) Name() string { return DriverName }

// Launch starts QEMU for spec and returns once QMP answers. It does not wait
// for the guest to boot. A spec that cannot work (missing kernel, bad sizes)
// fails with errdefs.ErrInvalidArgument before anything is started. On any
// error QEMU is killed and reaped and the files made are removed.
//
// The VM returned is a *VM, whose QMP method serves features beyond
// hypervisor.VM.
func (d *Driver) Launch(ctx context.Context, spec hypervisor.Spec) (hypervisor.VM, error) {
	vm, err := d.launch(ctx, spec)
	if err != nil {
		return nil, err
	}
	return vm, nil
}

// launch is Launch returning the concrete type.
func (d *Driver) launch(ctx context.Context, spec hypervisor.Spec) (_ *VM, retErr error) {
	started := time.Now()
	lg := log.G(ctx).WithField("sandbox", spec.ID)
	if err := validateSpec(spec); err != nil {
		return nil, err
	}
	bin, err := exec.LookPath(d.cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("qemu binary %q: %w", d.cfg.Binary, errors.Join(errdefs.ErrNotFound, err))
	}
	var fsBin string
	if spec.Share != nil {
		if fsBin, err = exec.LookPath(d.cfg.Virtiofsd); err != nil {
			return nil, fmt.Errorf("virtiofsd %q, needed to share host directories (Debian package qemu-system-common): %w",
				d.cfg.Virtiofsd, errors.Join(errdefs.ErrNotFound, err))
		}
	}
	if err := clearStaleState(ctx, lg, spec.StateDir); err != nil {
		return nil, err
	}

	p := launchParams{spec: spec, tbSizeMiB: d.cfg.TBSizeMiB}
	if spec.Accel == hypervisor.AccelTCG {
		khz, err := d.tsc.hostTSCKHz()
		if err != nil {
			// The guest may stall calibrating its TSC; say so, but let
			// it try: the start deadline and the console tail will tell.
			lg.WithError(err).Warn("starting a tcg guest without tsc_early_khz; the guest may hang calibrating its tsc")
		}
		p.tscKHz = khz
	}
	var vsock *os.File
	if spec.Channel == channel.Vsock {
		vhost, cid, err := reserveCID(d.nextCID)
		if err != nil {
			return nil, fmt.Errorf("vsock agent channel: %w", err)
		}
		defer vhost.Close() // QEMU holds its own copy once started
		p.cid = cid
		vsock = vhost
	}
	vhostNet, err := openVhostNet(d.vhostNet, spec)
	if err != nil {
		e := lg.WithError(err).WithField("device", d.vhostNet)
		if errors.Is(err, os.ErrNotExist) {
			e.Info("no vhost-net: the guest's network goes through qemu")
		} else {
			e.Warn("cannot open vhost-net: the guest's network goes through qemu")
		}
	}
	withVhostNet := len(vhostNet) > 0
	// Closed once QEMU has started (it holds its own copies), or on a
	// failure before. The taps stay the caller's.
	defer func() { closeFiles(vhostNet) }()
	extra, nics := inheritedFiles(vsock, spec.NICs, vhostNet)
	p.nics = nics

	// The file server first: QEMU connects to it while it builds the
	// machine, and waits for its answers before it serves QMP.
	var fs *virtiofsd
	if spec.Share != nil {
		if fs, err = startVirtiofsd(lg, fsBin, spec); err != nil {
			return nil, err
		}
		// Runs after QEMU is killed (deferred below), whose going
		// away ends the daemon.
		defer func() {
			if retErr != nil {
				if why := fs.failure(virtiofsdFailWait); why != nil {
					retErr = fmt.Errorf("%w: %w", why, retErr)
				}
				fs.stop(context.WithoutCancel(ctx))
				// As console.log: its tail is in the error.
				removeFiles(lg, p.path(VirtiofsdLogName))
			}
		}()
	}

	// Undo what was made if anything below fails.
	var made []string
	defer func() {
		if retErr != nil {
			removeFiles(lg, made...)
		}
	}()

	consolePath := p.path(ConsoleLogName)
	consoleFile, err := os.OpenFile(consolePath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create console log: %w", err)
	}
	made = append(made, consolePath)
	limit := spec.ConsoleLogBytes
	if limit <= 0 {
		limit = DefaultConsoleLogBytes
	}

	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		consoleFile.Close()
		return nil, fmt.Errorf("console pipe: %w", err)
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		consoleFile.Close()
		stdoutR.Close()
		stdoutW.Close()
		return nil, fmt.Errorf("stderr pipe: %w", err)
	}

	cmd := exec.Command(bin, commandLine(p)...)
	cmd.Stdout = stdoutW
	cmd.Stderr = stderrW
	cmd.ExtraFiles = extra
	// QEMU needs nothing from the shim's environment.
	cmd.Env = []string{}
	// Its sockets are bound by name in the state dir (see qmpChardev).
	cmd.Dir = spec.StateDir
	// Its own process group, so that a signal meant for the shim's group
	// (a terminal's ^C, containerd killing the shim) does not reach it.
	// No Pdeathsig: the guest must outlive a crashed shim.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	made = append(made, p.path(QMPSocketName), p.path(AgentSocketName))
	if spec.NetNS != "" {
		err = network.InNamespace(spec.NetNS, cmd.Start)
	} else {
		err = cmd.Start()
	}
	stdoutW.Close()
	stderrW.Close()
	closeFiles(vhostNet)
	vhostNet = nil
	if err != nil {
		consoleFile.Close()
		stdoutR.Close()
		stderrR.Close()
		return nil, fmt.Errorf("start qemu: %w", err)
	}

	v := &VM{
		id:        spec.ID,
		memory:    spec.Memory,
		stateDir:  spec.StateDir,
		proc:      childProcess{cmd},
		name:      nameArg(spec.StateDir),
		log:       lg.WithField("pid", cmd.Process.Pid),
		console:   newRing(consoleRingBytes),
		stderrLog: newRing(stderrRingBytes),
		exited:    make(chan struct{}),
		ioDone:    make(chan struct{}),
		stopSem:   make(chan struct{}, 1),
		qmpClosed: make(chan struct{}),
		fs:        fs,
	}
	if spec.Channel == channel.Vsock {
		v.endpoint = channel.Endpoint{Kind: channel.Vsock, CID: p.cid, Port: channel.VsockPort}
	} else {
		v.endpoint = channel.Endpoint{Kind: channel.Serial, SocketPath: p.path(AgentSocketName)}
	}
	v.startPumps(stdoutR, stderrR, &cappedLog{f: consoleFile, limit: limit})
	go v.reap()
	defer func() {
		if retErr != nil {
			v.kill()
		}
	}()

	pidPath := p.path(PIDFileName)
	made = append(made, pidPath)
	if err := writePIDFile(pidPath, cmd.Process.Pid); err != nil {
		return nil, err
	}

	client, err := v.waitQMP(ctx, p.path(QMPSocketName))
	if err != nil {
		return nil, err
	}
	v.qmp = client
	v.machine = machineOf(spec, client.Greeting().Version)
	go v.watchEvents()
	qmpReady := time.Since(started)
	if spec.Restore != nil {
		if err := v.restore(ctx, spec.Restore); err != nil {
			return nil, err
		}
	}

	v.log.WithFields(log.Fields{
		"accel":        spec.Accel,
		"channel":      v.endpoint.String(),
		"nics":         len(spec.NICs),
		"vhost_net":    withVhostNet,
		"share":        spec.Share != nil,
		"qmp_ready_ms": qmpReady.Milliseconds(),
		"restored":     spec.Restore != nil,
		"started_ms":   time.Since(started).Milliseconds(),
	}).Info("qemu started")
	return v, nil
}

// validateSpec rejects what QEMU would fail on, or misread, with a message
// naming the culprit.
func validateSpec(s hypervisor.Spec) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", errdefs.ErrInvalidArgument, fmt.Sprintf(format, a...))
	}
	if s.ID == "" {
		return bad("sandbox id is empty")
	}
	if !filepath.IsAbs(s.StateDir) {
		return bad("state dir %q is not an absolute path", s.StateDir)
	}
	if fi, err := os.Stat(s.StateDir); err != nil {
		return fmt.Errorf("%w: state dir: %w", errdefs.ErrInvalidArgument, err)
	} else if !fi.IsDir() {
		return bad("state dir %s is not a directory", s.StateDir)
	}
	if s.Kernel == "" {
		return bad("no guest kernel given")
	}
	if err := readableFile("guest kernel", s.Kernel); err != nil {
		return err
	}
	if err := checkKernelFormat(s.Kernel); err != nil {
		return err
	}
	if s.Initrd != "" {
		if err := readableFile("guest initrd", s.Initrd); err != nil {
			return err
		}
	}
	if s.VCPUs < 1 || s.VCPUs > 255 {
		return bad("vcpus = %d, want 1-255", s.VCPUs)
	}
	if s.MemoryMiB < 64 {
		return bad("memory = %d MiB, want at least 64", s.MemoryMiB)
	}
	switch s.Accel {
	case hypervisor.AccelKVM, hypervisor.AccelTCG:
	default:
		return bad("accelerator %q is not resolved to kvm or tcg", s.Accel)
	}
	switch s.Channel {
	case channel.Serial, channel.Vsock:
	default:
		return bad("agent channel %q is not resolved to serial or vsock", s.Channel)
	}
	for _, a := range s.KernelArgs {
		if a == "" || strings.ContainsFunc(a, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return bad("kernel argument %q is empty or holds control characters", a)
		}
	}
	if err := validateNICs(s.NICs); err != nil {
		return err
	}
	if err := validateShare(s); err != nil {
		return err
	}
	if err := checkTransports(s); err != nil {
		return err
	}
	// x86 Linux truncates its command line at 2048 bytes with the NUL,
	// and microvm appends an entry for each virtio device, without
	// which the guest does not find it.
	if n := len(kernelCmdline(launchParams{spec: s, tscKHz: 1 << 32})) + mmioCmdlineBytes*len(machineOf(s, qmp.Version{}).Devices); n > 2047 {
		return bad("kernel command line is %d bytes with microvm's virtio_mmio.device entries, more than the 2047 the guest reads", n)
	}
	if s.ConsoleLogBytes < 0 {
		return bad("console log bytes = %d is negative", s.ConsoleLogBytes)
	}
	if m := s.Memory; m != nil {
		if !filepath.IsAbs(m.Path) {
			return bad("memory file %q is not an absolute path", m.Path)
		}
		if !m.Shared {
			if err := readableFile("memory file", m.Path); err != nil {
				return err
			}
		}
	}
	if s.Restore != nil {
		return validateRestore(s.Restore)
	}
	return nil
}

// readableFile checks that path is a non-empty regular file this process
// can open for reading, so a typo fails here, naming the path, rather than
// inside QEMU.
func readableFile(what, path string) error {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("%w: %s %s: %w", errdefs.ErrInvalidArgument, what, path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", errdefs.ErrInvalidArgument, what, path, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() == 0 {
		return fmt.Errorf("%w: %s %s is not a non-empty regular file", errdefs.ErrInvalidArgument, what, path)
	}
	return nil
}

// checkKernelFormat accepts what the driver boots: an ELF vmlinux (PVH entry)
// or a bzImage (setup header magic "HdrS" at 0x202). QEMU would take
// anything else for an ancient zImage and run it as code, hanging the start
// instead of failing it.
func checkKernelFormat(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: guest kernel %s: %w", errdefs.ErrInvalidArgument, path, err)
	}
	defer f.Close()
	var hdr [0x206]byte
	n, _ := io.ReadFull(f, hdr[:])
	if n >= 4 && string(hdr[:4]) == "\x7fELF" {
		return nil
	}
	if n == len(hdr) && string(hdr[0x202:0x206]) == "HdrS" {
		return nil
	}
	return fmt.Errorf("%w: guest kernel %s is neither an ELF vmlinux nor a bzImage", errdefs.ErrInvalidArgument, path)
}

// clearStaleState refuses a state dir whose QEMU still runs and removes the
// leftovers of one that is gone, ending a virtiofsd left without its QEMU.
func clearStaleState(ctx context.Context, lg *log.Entry, stateDir string) error {
	pid, err := readPIDFile(filepath.Join(stateDir, PIDFileName))
	if err == nil && isOurQEMU(pid, stateDir) {
		return fmt.Errorf("%w: qemu pid %d still runs for %s; stop it or run Cleanup first", errdefs.ErrAlreadyExists, pid, stateDir)
	}
	if err := cleanupVirtiofsd(ctx, lg, stateDir); err != nil {
		return fmt.Errorf("stale virtiofsd: %w", err)
	}
	for _, name := range []string{QMPSocketName, AgentSocketName, PIDFileName, NameFileName} {
		if err := os.Remove(filepath.Join(stateDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove stale %s: %w", name, err)
		}
	}
	return nil
}

// writePIDFile writes pid atomically, so a reader never sees half a number.
func writePIDFile(path string, pid int) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write pid file: %w", err)
	}
	return nil
}

func readPIDFile(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("pid file %s: bad pid %q", path, strings.TrimSpace(string(data)))
	}
	return pid, nil
}

// isOurQEMU says whether pid is a QEMU serving stateDir, judged from its
// command line, so that a recycled pid is never signalled. A QEMU
// launched for stateDir has its path in its -name; one adopted from a
// spare has the spare's, which stateDir's NameFileName records.
func isOurQEMU(pid int, stateDir string) bool {
	want := nameArg(stateDir)
	if data, err := os.ReadFile(filepath.Join(stateDir, NameFileName)); err == nil {
		want = strings.TrimSpace(string(data))
	}
	return hasName(pid, want)
}

// hasName says whether pid is a QEMU whose -name is name.
func hasName(pid int, name string) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	argv := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
	if len(argv) == 0 || !strings.HasPrefix(filepath.Base(argv[0]), "qemu") {
		return false
	}
	for i := 1; i+1 < len(argv); i++ {
		if argv[i] == "-name" && argv[i+1] == name {
			return true
		}
	}
	return false
}

func removeFiles(lg *log.Entry, paths ...string) error {
	var errs []error
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			lg.WithError(err).WithField("path", p).Warn("remove qemu state file")
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// dialQMP connects to QEMU's QMP socket at sock, whatever its length.
func dialQMP(ctx context.Context, sock string) (*qmp.Client, error) {
	conn, err := channel.DialUnix(ctx, sock)
	if err != nil {
		return nil, fmt.Errorf("connect qmp socket %s: %w", sock, err)
	}
	return qmp.New(ctx, conn, qmp.Options{})
}

// waitQMP connects to QMP once QEMU serves it. QEMU only greets after its
// machine is built (kernel loaded), so a bad kernel shows up here as QEMU's
// exit, reported with its stderr.
func (v *VM) waitQMP(ctx context.Context, sock string) (*qmp.Client, error) {
	backoff := 2 * time.Millisecond
	for {
		c, err := dialQMP(ctx, sock)
		if err == nil {
			return c, nil
		}
		select {
		case <-v.exited:
			if err := v.ExitError(); err != nil {
				return nil, fmt.Errorf("qemu exited during startup: %w", err)
			}
			return nil, fmt.Errorf("%w: qemu exited during startup with status 0%s", hypervisor.ErrVMExited, stderrSuffix(v.stderrLog))
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for qemu control socket: %w (last error: %v)%s", ctx.Err(), err, stderrSuffix(v.stderrLog))
		case <-time.After(backoff):
		}
		if backoff < 50*time.Millisecond {
			backoff *= 2
		}
	}
}
