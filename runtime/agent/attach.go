package agent

import (
	"context"
	"fmt"
	"io"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/api"
)

// AttachSpec names a process of the guest, started in an earlier session
// (by a shim that restarted, or before the VM was saved to the snapshot it
// was restored from), whose stdio this session takes over.
type AttachSpec struct {
	// ID names the process in the agent (see ProcessSpec.ID).
	ID string
	// Terminal says the process runs on a pty: its output arrives on
	// Stdout and Stderr must be nil.
	Terminal bool
	// Stdin, Stdout and Stderr are as in ProcessSpec, for the kinds of
	// stdio the process was started with; a kind left nil is detached
	// (the output is discarded, stdin reads EOF). Stdout and Stderr
	// first get what the process wrote while no session took it.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// AttachProcess hands the stdio of a process that runs in the guest, or
// that exited and has not been waited for, to this session. The Process
// it returns is like one from Start: Wait, Signal, CloseStdin, Resize and
// Pid work on it. A process the guest does not know (or that was waited
// for) is errdefs.ErrNotFound; a kind of stdio it was started without is
// errdefs.ErrInvalidArgument. On error the process is left as it was.
func (c *Client) AttachProcess(ctx context.Context, spec AttachSpec) (*Process, error) {
	op := fmt.Sprintf("attach process %s", spec.ID)
	if spec.Terminal && spec.Stderr != nil {
		return nil, fmt.Errorf("%s: a terminal has no separate stderr: %w", op, errdefs.ErrInvalidArgument)
	}
	req := &api.AttachProcessRequest{
		Id:     spec.ID,
		Stdin:  spec.Stdin != nil,
		Stdout: spec.Stdout != nil,
		Stderr: spec.Stderr != nil,
	}
	return c.startWithStdio(ctx, op, spec.ID, spec.Stdin, spec.Stdout, spec.Stderr, func(ctx context.Context) (uint32, error) {
		resp, err := c.agent.AttachProcess(ctx, req)
		if err != nil {
			return 0, err
		}
		return resp.Pid, nil
	})
}
