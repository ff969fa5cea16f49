package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Host is the node's containerd, as install reaches it.
type Host interface {
	// Containerd runs the host's containerd binary with args and
	// returns what it printed on stdout.
	Containerd(ctx context.Context, args ...string) ([]byte, error)
	// RestartContainerd restarts the host's containerd service and
	// returns once it runs again.
	RestartContainerd(ctx context.Context) error
}

// nsenter runs a program in the namespaces of the host's PID 1 from a
// container that shares the host's PID namespace (the DaemonSet's
// hostPID), as kata-deploy does: the program sees the host's files, its
// systemd and its containerd.
func nsenter() []string {
	return []string{"nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--"}
}

// DefaultRestartCommand restarts a containerd that systemd runs.
const DefaultRestartCommand = "systemctl restart containerd"

// CommandHost reaches the host's containerd through commands, run
// directly or, from a container, through nsenter.
type CommandHost struct {
	// ContainerdPath is the host's containerd binary; "containerd" is
	// found on the PATH (the host's, through NSEnter).
	ContainerdPath string
	// NSEnter runs the commands in the namespaces of the host's PID 1,
	// through nsenter.
	NSEnter bool
	// Restart is the command that restarts containerd.
	Restart []string
}

func (h CommandHost) command(ctx context.Context, args ...string) *exec.Cmd {
	if h.NSEnter {
		args = append(nsenter(), args...)
	}
	return exec.CommandContext(ctx, args[0], args[1:]...)
}

func (h CommandHost) run(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := h.command(ctx, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		return out, fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, msg)
	}
	return out, nil
}

// Containerd implements Host.
func (h CommandHost) Containerd(ctx context.Context, args ...string) ([]byte, error) {
	bin := h.ContainerdPath
	if bin == "" {
		bin = "containerd"
	}
	return h.run(ctx, 30*time.Second, append([]string{bin}, args...)...)
}

// RestartContainerd implements Host: systemd's restart of a notify unit
// (containerd.service) returns once containerd is ready.
func (h CommandHost) RestartContainerd(ctx context.Context) error {
	if len(h.Restart) == 0 {
		return fmt.Errorf("no command to restart containerd")
	}
	_, err := h.run(ctx, 2*time.Minute, h.Restart...)
	return err
}
