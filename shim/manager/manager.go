// Package manager is the shim binary's bootstrap: what containerd runs as
// `containerd-shim-cocoon-v2 [flags] start|delete`, and the long-lived
// server process that `start` launches. One binary serves containerd 1.6,
// 1.7 and 2.x: `start` detects which bootstrap protocol its caller speaks
// and answers in it (bootstrap.go), and the server serves the Task API as
// both v2 and v3 (shim/task).
//
// One shim, and one VM, per sandbox: a pod's containers join the shim of
// the pod's sandbox container; a standalone container gets its own.
package manager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/containerd/log"
)

// RuntimeName is the runtime type containerd knows Cocoon by.
const RuntimeName = "io.containerd.cocoon.v2"

// Env is what the process was started with: Run takes it rather than
// reading os's globals, so tests can drive every action in process.
type Env struct {
	// Args are the command-line arguments, without the program name.
	Args []string
	// Stdin, Stdout and Stderr are the standard streams.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Getenv reads the environment.
	Getenv func(string) string
}

// Main runs the shim with the process's arguments and streams and returns
// its exit code.
func Main() int {
	err := Run(context.Background(), Env{
		Args:   os.Args[1:],
		Stdin:  os.Stdin,
		Stdout: os.Stdout,
		Stderr: os.Stderr,
		Getenv: os.Getenv,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", RuntimeName, err)
		return 1
	}
	return 0
}

// Run runs the action the arguments name: start, delete, or (none) serve.
func Run(ctx context.Context, env Env) error {
	f, err := parseFlags(env.Args)
	if err != nil {
		return err
	}
	switch {
	case f.version:
		return printVersion(env.Stdout)
	case f.info:
		return printInfo(env.Stdout)
	}
	if f.namespace == "" {
		return errors.New("-namespace is required")
	}
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("runtime", RuntimeName).WithField("namespace", f.namespace))
	switch f.action {
	case "start":
		return start(ctx, f, env)
	case "delete":
		return deleteAction(ctx, f, env)
	case "":
		return serve(ctx, f, env)
	}
	return fmt.Errorf("unknown action %q: want start or delete", f.action)
}
