package agent

import (
	"context"
	"fmt"
	"syscall"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/guest/api"
)

// SignalProcess sends sig to the guest process named id, for a process
// the caller has no *Process of (the undo of a start whose answer was
// lost). The guest answers ErrFailedPrecondition while the process is
// still starting and ErrNotFound for one it does not know.
func (c *Client) SignalProcess(ctx context.Context, id string, sig syscall.Signal) error {
	if sig <= 0 {
		return fmt.Errorf("signal %d: %w", sig, errdefs.ErrInvalidArgument)
	}
	_, err := c.agent.SignalProcess(ctx, &api.SignalProcessRequest{Id: id, Signal: uint32(sig)})
	return c.mapErr(fmt.Sprintf("signal process %s", id), err)
}

// WaitProcess waits for the guest process named id to exit and has the
// guest forget it; its output streams, if any, are not read.
func (c *Client) WaitProcess(ctx context.Context, id string) (ExitStatus, error) {
	resp, err := c.agent.WaitProcess(ctx, &api.WaitProcessRequest{Id: id})
	if err != nil {
		return ExitStatus{}, c.mapErr(fmt.Sprintf("wait for process %s", id), err)
	}
	return ExitStatus{Code: resp.ExitStatus, Signal: syscall.Signal(resp.Signal), OOMKills: resp.OomKills}, nil
}
