package admin

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/agent"
)

// RunOptions describe a command to run in a throwaway microVM.
type RunOptions struct {
	// Args is the command and its arguments.
	Args []string
	// Env is added to the guest process's environment.
	Env []string
	// Cwd is the working directory in the guest.
	Cwd string
	// Stdin, Stdout and Stderr are connected to the process; a nil Stdin
	// gives it /dev/null.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Run boots a sandbox, runs one command in the guest with its stdio
// connected, stops the sandbox and returns the command's exit status (as
// runc reports it: 128+signal when a signal ended it). SIGINT and SIGTERM
// to this process are passed to the guest process.
func (e *Env) Run(ctx context.Context, o RunOptions) (uint32, error) {
	if len(o.Args) == 0 {
		return 0, fmt.Errorf("run: no command given")
	}
	sb, _, err := e.StartSandboxWithTemplate(ctx, "run")
	if err != nil {
		return 0, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*e.Config.Runtime.StopTimeout.Duration)
		defer cancel()
		if err := sb.Stop(stopCtx); err != nil {
			log.G(ctx).WithError(err).Warn("stop sandbox")
		}
	}()
	p, err := sb.Agent().Start(ctx, agent.ProcessSpec{
		ID:     "run",
		Args:   o.Args,
		Env:    o.Env,
		Cwd:    o.Cwd,
		Stdin:  o.Stdin,
		Stdout: o.Stdout,
		Stderr: o.Stderr,
	})
	if err != nil {
		return 0, fmt.Errorf("start %q in the guest: %w", o.Args[0], err)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM)
	defer func() {
		signal.Stop(sigs)
		close(sigs)
	}()
	go func() {
		for s := range sigs {
			if err := p.Signal(ctx, s.(unix.Signal), false); err != nil {
				log.G(ctx).WithError(err).Debug("forward signal")
			}
		}
	}()
	st, err := p.Wait(ctx)
	if err != nil {
		return 0, fmt.Errorf("wait for %q in the guest: %w", o.Args[0], err)
	}
	return st.Code, nil
}
