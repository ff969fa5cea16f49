package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/sandbox"
	"github.com/cocoonrt/cocoon/shim/task"
	"github.com/cocoonrt/cocoon/shim/vm"
)

// maxStdin bounds what start reads from containerd on stdin.
const maxStdin = 10 << 20

// start answers `<shim> ... -id <id> start`, run by containerd in the
// container's bundle: it returns the address of the shim that will serve
// the container (launching it if the container starts a sandbox of its
// own) in the form the caller speaks.
func start(ctx context.Context, f flags, env Env) error {
	input, err := io.ReadAll(io.LimitReader(env.Stdin, maxStdin))
	if err != nil {
		return fmt.Errorf("read stdin: %w", err)
	}
	c, err := detectCaller(input, f, env.Getenv)
	if err != nil {
		return err
	}
	bundle, err := bundleDir(f)
	if err != nil {
		return err
	}
	ctx, closeLog := actionLog(ctx, bundle, c.debug)
	defer closeLog()
	log.G(ctx).WithField("id", f.id).WithField("protocol", c.protocol.String()).Info("shim start")
	address, err := startShim(ctx, f, c, bundle, env.Getenv)
	if err != nil {
		return err
	}
	out, err := c.answer(address)
	if err != nil {
		return err
	}
	_, err = env.Stdout.Write(out)
	return err
}

// bundleDir is -bundle, or the working directory containerd ran us in.
func bundleDir(f flags) (string, error) {
	if f.bundle != "" {
		return f.bundle, nil
	}
	return os.Getwd()
}

// startShim saves what delete needs, then makes sure a shim serves the
// container's sandbox, and returns its address.
func startShim(ctx context.Context, f flags, c caller, bundle string, getenv func(string) string) (string, error) {
	annotations, err := readAnnotations(bundle)
	if err != nil {
		return "", err
	}
	sandboxID, joins := task.SandboxID(f.id, annotations)
	// Both name the sandbox's state directory.
	if err := sandbox.ValidName("namespace", f.namespace); err != nil {
		return "", err
	}
	if err := sandbox.ValidName("sandbox id", sandboxID); err != nil {
		return "", err
	}
	cfg, err := vm.LoadConfig(c.options, nil, getenv)
	if err != nil {
		return "", err
	}
	address, err := socketAddress(c.socketDir, c.grpcAddress, f.namespace, sandboxID)
	if err != nil {
		return "", err
	}
	if joins && !canConnect(address) {
		return "", fmt.Errorf("container %s belongs to sandbox %s, whose shim is not running: %w", f.id, sandboxID, errdefs.ErrFailedPrecondition)
	}
	st := bundleState{
		Namespace: f.namespace, ContainerID: f.id, SandboxID: sandboxID,
		SandboxDir: vm.StateDir(cfg, f.namespace, sandboxID), Address: address,
	}
	if err := writeBundleState(bundle, st); err != nil {
		return "", err
	}
	if joins {
		log.G(ctx).WithField("sandbox", sandboxID).Debug("joining the sandbox's shim")
	} else if err := launchServer(ctx, f, c, bundle, address); err != nil {
		return "", err
	}
	if err := writeFileAtomic(filepath.Join(bundle, "address"), []byte(address), 0o644); err != nil {
		return "", err
	}
	return address, nil
}

// readAnnotations reads the annotations of the bundle's OCI spec.
func readAnnotations(bundle string) (map[string]string, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read OCI spec: %w", err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("OCI spec in %s: %w: %v", bundle, errdefs.ErrInvalidArgument, err)
	}
	return spec.Annotations, nil
}

// launchServer starts the shim's server process: this binary again,
// without an action, in a session of its own (so that it outlives
// containerd's process group), serving the socket it inherits as fd 3. Its
// stdout and stderr are not the start process's: containerd waits for
// those to close before it reads the answer.
func launchServer(ctx context.Context, f flags, c caller, bundle, address string) (retErr error) {
	l, err := listen(address)
	if errors.Is(err, errShimRunning) {
		log.G(ctx).WithField("address", address).Info("a shim already serves this sandbox")
		return nil
	}
	if err != nil {
		return err
	}
	// Our copy of the listener goes; the socket file stays for the server.
	l.SetUnlinkOnClose(false)
	defer l.Close()
	defer func() {
		if retErr != nil {
			removeSocket(address)
		}
	}()
	lf, err := l.File()
	if err != nil {
		return fmt.Errorf("shim socket: %w", err)
	}
	defer lf.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{"-namespace", f.namespace, "-id", f.id, "-address", c.grpcAddress}
	if c.debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = bundle
	cmd.Env = append(os.Environ(), "TTRPC_ADDRESS="+c.ttrpcAddress)
	cmd.ExtraFiles = []*os.File{lf}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start shim server: %w", err)
	}
	adjustOOMScore(ctx, cmd.Process.Pid)
	log.G(ctx).WithField("pid", cmd.Process.Pid).WithField("address", address).Info("shim server started")
	return cmd.Process.Release()
}

// adjustOOMScore makes the shim a little likelier than containerd (the
// start process's parent) to be chosen by the OOM killer, as containerd's
// shims do, so that containerd survives.
func adjustOOMScore(ctx context.Context, pid int) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", os.Getppid()))
	if err != nil {
		return
	}
	score, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return
	}
	score = min(score+1, 1000)
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(score)), 0); err != nil {
		log.G(ctx).WithError(err).Debug("adjust the shim's OOM score")
	}
}

func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
