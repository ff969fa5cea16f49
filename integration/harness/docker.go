// Docker for the integration tests: dockerd of moby v2.0.0-beta.24, built
// from the Go module proxy by `make test-deps` (integration/install-docker.sh)
// into /opt/cocoon-test/docker/bin, with the docker CLI of Debian 12's
// docker.io (20.10) beside it. The CLI speaks API 1.41 and negotiates it:
// the daemon takes 1.40 to 1.56, so no DOCKER_API_VERSION is set.
//
// Each Docker is a daemon of its own on one Containerd (--containerd), in
// containerd namespaces of its own (Namespace, and another for plugins),
// which keep its containers and, moby v2 using containerd's image store,
// its images apart from what ctr or nerdctl put in the Containerd's. Its
// data root, exec root, pid file, socket, config file and log, and the
// CLI's config directory, are under Dir, removed at Cleanup.
//
// Its default bridge network is a bridge that the harness makes, named
// and addressed for a slot that no other Docker holds (reserveNetSlot):
// cocoon-dkr<slot>, 10.241.<slot>.1/24, passed with --bridge. Without
// --bridge dockerd makes and keeps docker0, the same name for every
// daemon on the host; --bip cannot go with --bridge, dockerd takes the
// bridge's own address instead. User-defined networks get /28s of
// 10.242.<slot>.0/24 (default-address-pools). None of these is a subnet
// of the other tests (CRI's 10.240.0.0/16, the nerdctl and network tests'
// 10.201-10.213, nerdctl's default 10.4.0.0/24).
//
// --userland-proxy=false: a published port is iptables DNAT only, with
// route_localnet on the bridge for 127.0.0.1 (install-docker.sh builds no
// docker-proxy). --ip-forward-no-drop: dockerd turns IP forwarding on and
// would set the host's FORWARD policy to DROP with it. A clean stop keeps
// the default network's rules (the bridge's jumps, the subnet's
// masquerade), which dockerd finds again at its next start: Leftovers
// does not count them and Cleanup removes them with the bridge. dockerd's
// chains (DOCKER, DOCKER-FORWARD, ...) and the jumps to them are shared
// by every dockerd on the host and stay, as CNI's do.
//
// Time namespaces: moby v2 gives every container one of its own when
// /proc/self/ns/time exists (daemon/pkg/oci's default spec; only a kernel
// without them has daemon/oci_linux.go remove it), and Debian 12's runc
// 1.1.5 fails such a container: `namespace {"time" ""} does not exist`.
// The config file's "features": {"time-namespaces": false} is moby's
// switch for that (getSysInfo in daemon/daemon_unix.go); it is the
// daemon's, so Cocoon's containers get no time namespace either.

package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/vishvananda/netlink"

	"github.com/cocoonrt/cocoon/runtime/share"
)

// dockerDir holds the dockerd and docker that `make test-deps` installs;
// COCOON_DOCKER names another directory holding both.
const (
	dockerDir    = "/opt/cocoon-test/docker/bin"
	dockerEnvVar = "COCOON_DOCKER"
)

// The runtimes a Docker's daemon has besides runc (its default), for
// `docker run --runtime`: Cocoon's shim, configured as the Containerd's
// environment says (COCOON_CONFIG, COCOON_STATE_DIR, ...); and, when that
// environment names a config file, the shim again with a copy of that
// file (Docker.RuntimeConfig) given as the runtime's options
// (runtimeoptions' ConfigPath), which the shim reads instead of
// COCOON_CONFIG's: a test that changes the copy sees which file a
// container's VM was made from.
const (
	DockerCocoonRuntime           = "cocoon"
	DockerCocoonConfigPathRuntime = "cocoon-configpath"
)

// dockerInitPath is the init that docker run --init runs as the
// container's PID 1: Debian's tini (make test-deps installs it), static,
// since it runs on the container's root.
const dockerInitPath = "/usr/bin/tini-static"

// dockerHostSandbox is the key of libnetwork's sandbox of the host's
// network namespace, under <exec root>/netns.
const dockerHostSandbox = "default"

// dockerSlots is how many Dockers may run at once on a host: slot n has
// the bridge cocoon-dkr<n> on 10.241.n.0/24 and the pool 10.242.n.0/24.
const dockerSlots = 256

// ErrDockerNotInstalled is returned when dockerd or the docker CLI is not
// on this machine; the tests skip on it.
var ErrDockerNotInstalled = errors.New("docker not installed")

// Docker is a running private dockerd on a Containerd, and the docker CLI
// bound to it.
type Docker struct {
	// Bin is the docker CLI, Daemon dockerd.
	Bin    string
	Daemon string
	// Containerd is the containerd the daemon runs its containers on.
	Containerd *Containerd
	// Namespace is the containerd namespace of the daemon's containers
	// and images.
	Namespace string
	// Dir holds everything of this Docker: DataRoot, ExecRoot, the
	// socket (Host), the config file, the pid file, dockerd's log and the
	// CLI's config directory.
	Dir      string
	DataRoot string
	ExecRoot string
	// Host is the daemon's socket, as DOCKER_HOST says it.
	Host string
	// Bridge is the default network's bridge, on Subnet; Pool is where
	// user-defined networks get theirs.
	Bridge string
	Subnet *net.IPNet
	Pool   *net.IPNet
	// RuntimeConfig is the Cocoon configuration file that the runtime
	// DockerCocoonConfigPathRuntime names in its options; "" without
	// that runtime.
	RuntimeConfig string
	// Timeout bounds each command: two minutes unless changed.
	Timeout time.Duration

	// slot holds the slot of Bridge, Subnet and Pool (reserveNetSlot).
	slot net.Listener
	// cmd is dockerd's, nil until it is started; exited is closed when
	// it has exited; ready says that it answered.
	cmd    *exec.Cmd
	exited chan struct{}
	ready  bool
	// baseline are the rules of the default network, which dockerd made
	// at start-up (see ownRules); Leftovers does not count them.
	baseline map[string]bool
	// madeRunDir: dockerd made /run/docker, where every dockerd keeps
	// its plugins' sockets whatever its exec root; Cleanup removes it if
	// it is empty.
	madeRunDir bool
	// stopOnce makes Stop run once, stopErr is what it returned;
	// cleanOnce and cleanErr the same for Cleanup.
	stopOnce  sync.Once
	stopErr   error
	cleanOnce sync.Once
	cleanErr  error
}

// OpenDocker starts a Docker on c and waits until it answers, for a
// caller that is not a test (the benchmarks), which runs its Cleanup
// before c stops. ErrDockerNotInstalled says that dockerd or the docker
// CLI is not installed.
func OpenDocker(c *Containerd) (*Docker, error) { return startDocker(c) }

// NewDocker starts a Docker on c (which StartContainerd started), waits
// until it answers, and runs its Cleanup when the test ends, before c
// stops; dockerd's log is printed if the test failed. It skips the test
// if dockerd or the docker CLI is not installed.
func NewDocker(t testing.TB, c *Containerd) *Docker {
	t.Helper()
	d, err := startDocker(c)
	if errors.Is(err, ErrDockerNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dockerd log:\n%s", d.Log())
		}
		if err := d.Cleanup(); err != nil {
			t.Errorf("docker cleanup: %v", err)
		}
	})
	return d
}

// startDocker starts a Docker on c and waits until it answers; the caller
// must call Cleanup.
func startDocker(c *Containerd) (*Docker, error) {
	bin, err := testToolDir(dockerDir, dockerEnvVar, ErrDockerNotInstalled, "dockerd", "docker")
	if err != nil {
		return nil, err
	}
	slot, reservation, err := reserveNetSlot(dockerSlots, "cocoon-docker-slot-", dockerBridge, func(slot int) []*net.IPNet {
		return []*net.IPNet{dockerSubnet(slot), dockerPool(slot)}
	})
	if err != nil {
		return nil, fmt.Errorf("no free Docker network among 10.241.0.0/16: %w", err)
	}
	// Short: dockerd's socket is under it, and unix socket paths are
	// limited to 108 bytes.
	dir, err := os.MkdirTemp("", "dkr")
	if err != nil {
		reservation.Close()
		return nil, err
	}
	d := &Docker{
		Bin:        filepath.Join(bin, "docker"),
		Daemon:     filepath.Join(bin, "dockerd"),
		Containerd: c,
		Namespace:  fmt.Sprintf("cocoon-docker-%d", slot),
		Dir:        dir,
		DataRoot:   filepath.Join(dir, "data"),
		ExecRoot:   filepath.Join(dir, "exec"),
		Host:       "unix://" + filepath.Join(dir, "docker.sock"),
		Bridge:     dockerBridge(slot),
		Subnet:     dockerSubnet(slot),
		Pool:       dockerPool(slot),
		Timeout:    2 * time.Minute,
		slot:       reservation,
		exited:     make(chan struct{}),
	}
	if _, err := os.Stat(dockerRunDir); errors.Is(err, os.ErrNotExist) {
		d.madeRunDir = true
	}
	if err := d.start(); err != nil {
		return nil, errors.Join(err, d.Cleanup())
	}
	return d, nil
}

// dockerRunDir is where every dockerd keeps its plugins' sockets,
// whatever its exec root (moby's getPluginExecRoot).
const dockerRunDir = "/run/docker"

// dockerBridge, dockerSubnet and dockerPool are the default bridge, its
// subnet and the pool of user-defined networks of slot.
func dockerBridge(slot int) string { return fmt.Sprintf("cocoon-dkr%d", slot) }

func dockerSubnet(slot int) *net.IPNet {
	return &net.IPNet{IP: net.IPv4(10, 241, byte(slot), 0).To4(), Mask: net.CIDRMask(24, 32)}
}

func dockerPool(slot int) *net.IPNet {
	return &net.IPNet{IP: net.IPv4(10, 242, byte(slot), 0).To4(), Mask: net.CIDRMask(24, 32)}
}

// start makes the bridge, writes the config file, starts dockerd and
// waits until it answers, then notes the default network's rules.
func (d *Docker) start() error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: d.Bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("make the bridge %s: %w", d.Bridge, err)
	}
	gw := &net.IPNet{IP: slices.Clone(d.Subnet.IP), Mask: d.Subnet.Mask}
	gw.IP[3] = 1
	if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: gw}); err != nil {
		return fmt.Errorf("address the bridge %s: %w", d.Bridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("bring the bridge %s up: %w", d.Bridge, err)
	}
	runtimes := map[string]any{DockerCocoonRuntime: map[string]any{"runtimeType": CocoonRuntime}}
	if path := d.Containerd.getenv("COCOON_CONFIG"); path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("the Cocoon configuration for the runtime %s: %w", DockerCocoonConfigPathRuntime, err)
		}
		d.RuntimeConfig = filepath.Join(d.Dir, "cocoon-runtime.toml")
		if err := os.WriteFile(d.RuntimeConfig, data, 0o644); err != nil {
			return err
		}
		runtimes[DockerCocoonConfigPathRuntime] = map[string]any{
			"runtimeType": CocoonRuntime,
			"options":     map[string]string{"ConfigPath": d.RuntimeConfig},
		}
	}
	config, err := json.MarshalIndent(map[string]any{
		"features":              map[string]bool{"time-namespaces": false},
		"runtimes":              runtimes,
		"default-address-pools": []map[string]any{{"base": d.Pool.String(), "size": 28}},
		// docker run --init binds this into the container as
		// /sbin/docker-init (moby looks for docker-init on its PATH
		// otherwise, which Debian's tini does not provide).
		"init-path": dockerInitPath,
	}, "", "  ")
	if err != nil {
		return err
	}
	configFile := filepath.Join(d.Dir, "daemon.json")
	if err := os.WriteFile(configFile, config, 0o644); err != nil {
		return err
	}
	logf, err := os.OpenFile(d.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(d.Daemon,
		"--config-file", configFile,
		"--data-root", d.DataRoot,
		"--exec-root", d.ExecRoot,
		"--pidfile", filepath.Join(d.Dir, "docker.pid"),
		"-H", d.Host,
		"--containerd", d.Containerd.Address,
		"--containerd-namespace", d.Namespace,
		"--containerd-plugins-namespace", d.Namespace+"-plugins",
		"--bridge", d.Bridge,
		"--userland-proxy=false",
		"--iptables=true",
		"--ip-forward-no-drop",
	)
	// containerd's PATH: dockerd starts no shim itself (containerd does,
	// from its own PATH), but what it looks up by name (runc, whose
	// `runc features` it reads) is then what containerd finds.
	cmd.Env = append(withoutDockerEnv(os.Environ()), "PATH="+d.Containerd.ShimDir+":"+d.Containerd.Bin+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a test's end never leaves it behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start dockerd: %w", err)
	}
	d.cmd = cmd
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(d.exited)
	}()
	if err := d.waitReady(60 * time.Second); err != nil {
		return fmt.Errorf("dockerd: %w\n%s", err, d.logTail(40))
	}
	d.ready = true
	d.baseline = map[string]bool{}
	for _, r := range d.ownRules() {
		d.baseline[r.key()] = true
	}
	return nil
}

// withoutDockerEnv is env less its DOCKER_* settings (DOCKER_HOST,
// DOCKER_CONTEXT, DOCKER_DRIVER, ...), which are the test's user's and
// not for a private daemon or its CLI.
func withoutDockerEnv(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "DOCKER_") })
}

// waitReady waits until the daemon answers `docker version`.
func (d *Docker) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var err error
	for {
		select {
		case <-d.exited:
			return fmt.Errorf("dockerd exited during start-up: %v", d.cmd.ProcessState)
		default:
		}
		if _, err = os.Stat(strings.TrimPrefix(d.Host, "unix://")); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, _, err = d.run(ctx, "version")
			cancel()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not answering after %v: %v", timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// getenv is name's value in containerd's environment, which its shims
// inherit: Env's last setting of it, else the test's own.
func (c *Containerd) getenv(name string) string {
	for i := len(c.Env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(c.Env[i], name+"="); ok {
			return v
		}
	}
	return os.Getenv(name)
}

// Command returns a docker command with args, bound to ctx, against this
// daemon: DOCKER_HOST is its socket and DOCKER_CONFIG a directory of its
// own, so that the host's ~/.docker is not read.
func (d *Docker) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, d.Bin, args...)
	cmd.Env = append(withoutDockerEnv(os.Environ()), "DOCKER_HOST="+d.Host, "DOCKER_CONFIG="+filepath.Join(d.Dir, "cli"))
	// Its own process group, so that a timeout ends what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A process it started that keeps its stdout open does not hold
	// Run for ever.
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// RunErr runs docker with args for Timeout at most, and returns its
// stdout and stderr. On failure the error carries stderr and wraps the
// *exec.ExitError.
func (d *Docker) RunErr(args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), d.Timeout)
	defer cancel()
	return d.run(ctx, args...)
}

func (d *Docker) run(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	cmd := d.Command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err = cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", ctx.Err(), err)
		}
		err = fmt.Errorf("docker %s: %w\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), errb.String(), err
}

// Run is RunErr that fails t on error, and returns stdout.
func (d *Docker) Run(t testing.TB, args ...string) string {
	t.Helper()
	out, _, err := d.RunErr(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ImportBusybox loads the busybox image of ImportBusybox (an OCI archive
// of the host's static busybox) into the daemon with `docker load`, and
// returns its name, BusyboxRef, which `docker run` finds without a
// registry.
func (d *Docker) ImportBusybox(t testing.TB) string {
	t.Helper()
	archive, err := BusyboxArchive(t.TempDir())
	if err != nil {
		t.Fatalf("build busybox image: %v", err)
	}
	d.Run(t, "load", "-i", archive)
	return BusyboxRef
}

// Log is dockerd's log so far.
func (d *Docker) Log() string {
	data, _ := os.ReadFile(d.logPath())
	return string(data)
}

func (d *Docker) logPath() string { return filepath.Join(d.Dir, "dockerd.log") }

// logTail is the last n lines of dockerd's log.
func (d *Docker) logTail(n int) string {
	lines := strings.Split(strings.TrimRight(d.Log(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Stop ends dockerd: SIGTERM, which stops its running containers
// (within its 15 s shutdown timeout) and exits, then SIGKILL to its
// process group after 30 s. It returns an error if dockerd had to be
// killed or exited with a failure. It is safe to call more than once.
func (d *Docker) Stop() error {
	d.stopOnce.Do(func() { d.stopErr = d.stop() })
	return d.stopErr
}

func (d *Docker) stop() error {
	if d.cmd == nil {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
		return fmt.Errorf("dockerd still running 30 s after SIGTERM: killed\n%s", d.logTail(20))
	}
	if !d.cmd.ProcessState.Success() {
		return fmt.Errorf("dockerd: %v\n%s", d.cmd.ProcessState, d.logTail(20))
	}
	return nil
}

// Cleanup removes what the daemon has (its containers, then its
// user-defined networks) if it runs and answered, stops it, and removes
// what it leaves on the host: the rules of its bridges and subnets (see
// ownRules), the bridges (the default one, and those of user-defined
// networks that a stopped daemon kept), Dir (unmounting what is mounted
// under it first), and /run/docker if dockerd made it and left it empty;
// then it releases the slot. It is safe to call more than once.
func (d *Docker) Cleanup() error {
	d.cleanOnce.Do(func() { d.cleanErr = d.cleanup() })
	return d.cleanErr
}

func (d *Docker) cleanup() error {
	var errs []error
	if d.running() {
		out, _, err := d.RunErr("ps", "-a", "-q", "--no-trunc")
		if err != nil {
			errs = append(errs, err)
		}
		if ids := strings.Fields(out); len(ids) > 0 {
			if _, _, err := d.RunErr(append([]string{"rm", "-f"}, ids...)...); err != nil {
				errs = append(errs, err)
			}
		}
		if _, _, err := d.RunErr("network", "prune", "-f"); err != nil {
			errs = append(errs, err)
		}
	}
	if err := d.Stop(); err != nil {
		errs = append(errs, err)
	}
	for _, r := range d.ownRules() {
		args := append([]string{"-w", "-t", r.table, "-D", r.chain}, r.args...)
		if out, err := exec.Command(r.cmd, args...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %v: %s", r.cmd, strings.Join(args, " "), err, out))
		}
	}
	for index, name := range d.bridges() {
		if err := netlink.LinkDel(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Index: index}}); err != nil {
			errs = append(errs, fmt.Errorf("remove the bridge %s: %w", name, err))
		}
	}
	if err := share.RemoveAll(d.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", d.Dir, err))
	}
	if d.madeRunDir {
		// Only if empty: another dockerd may have started meanwhile.
		_ = os.Remove(filepath.Join(dockerRunDir, "plugins"))
		_ = os.Remove(dockerRunDir)
	}
	errs = append(errs, d.slot.Close())
	return errors.Join(errs...)
}

// running reports whether dockerd answered and has not exited.
func (d *Docker) running() bool {
	if !d.ready {
		return false
	}
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// Leftovers describes what the containers of this Docker left on the
// host after their removal (`docker rm -f`), whether dockerd still runs
// or was stopped, one finding a line, "" when nothing:
//   - containers, tasks and active snapshots (a container's writable
//     layer) in Namespace on the Containerd, and shims, runc's or
//     Cocoon's, that the Containerd started for Namespace;
//   - qemu-system-x86_64, virtiofsd and cocoon-netns-holder processes of
//     Cocoon's shims (of the Containerd's COCOON_STATE_DIR; see
//     processLeftovers);
//   - links on the default bridge or on the bridge of a user-defined
//     network (one with an address in Pool);
//   - iptables rules (filter, nat, raw; IPv4 and IPv6) that name one of
//     those bridges or have an address in Subnet or Pool, but not those
//     of the default network that dockerd made at start-up and keeps
//     when it stops, which Cleanup removes; a user-defined network's own
//     rules (its bridge's jumps, its masquerade) count until it is
//     removed, `docker network rm`, which a stopped daemon cannot do;
//   - mounts under Dir (the data root, the exec root), but not the data
//     root's bind on itself while dockerd runs (moby's
//     setupDaemonRootPropagation makes it shared so, and unmounts it at
//     shutdown), and network namespace files under ExecRoot/netns, but
//     not the host network's sandbox (its key dockerHostSandbox: a bind
//     of the host's namespace that libnetwork makes for the first
//     --network host container, with runc as with Cocoon, and leaves
//     mounted when it stops; Cleanup removes it).
func (d *Docker) Leftovers() string {
	var found []string
	found = append(found, d.containerdLeftovers()...)
	found = append(found, processLeftovers(d.Containerd.getenv("COCOON_STATE_DIR"), "qemu-system-x86_64", "virtiofsd", "cocoon-netns-holder")...)
	for _, l := range d.bridgeLinks() {
		found = append(found, fmt.Sprintf("link %s on the bridge %s", l[0], l[1]))
	}
	for _, r := range d.ownRules() {
		if !d.baseline[r.key()] {
			found = append(found, fmt.Sprintf("%s -t %s rule: %s", r.cmd, r.table, r.line))
		}
	}
	running := d.running()
	hostSandbox := filepath.Join(d.ExecRoot, "netns", dockerHostSandbox)
	if ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(d.Dir)); err == nil {
		for _, m := range ms {
			if (running && m.Mountpoint == d.DataRoot) || m.Mountpoint == hostSandbox {
				continue // dockerd's own, see Leftovers
			}
			found = append(found, fmt.Sprintf("%s mount at %s", m.FSType, m.Mountpoint))
		}
	}
	ents, _ := os.ReadDir(filepath.Join(d.ExecRoot, "netns"))
	for _, e := range ents {
		if e.Name() == dockerHostSandbox {
			continue
		}
		found = append(found, "network namespace file "+filepath.Join(d.ExecRoot, "netns", e.Name()))
	}
	sort.Strings(found)
	return strings.Join(found, "\n")
}

// WaitClean waits up to timeout for Leftovers to report nothing, as a
// removed container's shim (and a VM) go a moment after `docker rm`
// returns; it returns what is left then, "" when nothing is.
func (d *Docker) WaitClean(timeout time.Duration) string {
	var left string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if left = d.Leftovers(); left == "" {
			return ""
		}
	}
	return left
}

// containerdLeftovers lists the containers, tasks and active snapshots in
// Namespace, and the shims the Containerd started for it.
func (d *Docker) containerdLeftovers() []string {
	var found []string
	for _, what := range [][]string{{"containers", "ls", "-q"}, {"tasks", "ls", "-q"}} {
		out, err := d.ctr(what...)
		if err != nil {
			found = append(found, err.Error())
		}
		for _, id := range strings.Fields(out) {
			found = append(found, fmt.Sprintf("containerd %s %s in namespace %s", strings.TrimSuffix(what[0], "s"), id, d.Namespace))
		}
	}
	out, err := d.ctr("snapshots", "ls")
	if err != nil {
		found = append(found, err.Error())
	}
	for _, line := range strings.Split(out, "\n") {
		// KEY PARENT KIND, with PARENT empty for a base layer.
		if f := strings.Fields(line); len(f) >= 2 && f[len(f)-1] == "Active" {
			found = append(found, fmt.Sprintf("active snapshot %s in namespace %s", f[0], d.Namespace))
		}
	}
	for _, bin := range []string{ShimBinary, RuncShimBinary} {
		for _, pid := range ShimPIDsOf(bin, d.Containerd.Address) {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "cmdline"))
			args := strings.Split(string(cmdline), "\x00")
			if i := slices.Index(args, "-namespace"); i >= 0 && i+1 < len(args) && args[i+1] == d.Namespace {
				found = append(found, fmt.Sprintf("%s %d still running", bin, pid))
			}
		}
	}
	return found
}

// ctr runs ctr in Namespace, for a minute at most, and returns its
// stdout.
func (d *Docker) ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, stderr bytes.Buffer
	cmd := d.Containerd.ctrCommandIn(ctx, d.Namespace, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("ctr -n %s %s: %v: %s", d.Namespace, strings.Join(args, " "), err, stderr.String())
	}
	return out.String(), nil
}

// bridges are the default bridge and the bridges of the user-defined
// networks that exist: those with an IPv4 address in Pool.
func (d *Docker) bridges() map[int]string {
	links, _ := netlink.LinkList()
	found := map[int]string{}
	for _, l := range links {
		if l.Attrs().Name == d.Bridge {
			found[l.Attrs().Index] = d.Bridge
			continue
		}
		if l.Type() != "bridge" {
			continue
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			if d.Pool.Contains(a.IP) {
				found[l.Attrs().Index] = l.Attrs().Name
			}
		}
	}
	return found
}

// bridgeLinks lists the links on bridges, each as its name and its
// bridge's.
func (d *Docker) bridgeLinks() [][2]string {
	bridges := d.bridges()
	links, _ := netlink.LinkList()
	var found [][2]string
	for _, l := range links {
		if br, ok := bridges[l.Attrs().MasterIndex]; ok {
			found = append(found, [2]string{l.Attrs().Name, br})
		}
	}
	return found
}

// ownRules lists the iptables rules of this Docker's networks: those
// that name one of its bridges (see bridges) or have an address in
// Subnet or Pool.
func (d *Docker) ownRules() []iptablesRule {
	names := []string{}
	for _, br := range d.bridges() {
		names = append(names, br)
	}
	var own []iptablesRule
	for _, r := range iptablesRules() {
		named := slices.ContainsFunc(r.args, func(a string) bool { return slices.Contains(names, a) })
		if named || ruleInSubnets(r.args, []*net.IPNet{d.Subnet, d.Pool}) {
			own = append(own, r)
		}
	}
	return own
}

// key identifies a rule among the host's.
func (r iptablesRule) key() string { return r.cmd + " -t " + r.table + " " + r.line }
