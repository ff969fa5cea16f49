package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/cocoonrt/cocoon/runtime/checkpoint"
)

// checkpointCommand is `cocoon checkpoint`: what containerd saved of a
// task, looked at from the host.
func checkpointCommand() *cli.Command {
	return &cli.Command{
		Name:  "checkpoint",
		Usage: "Cocoon checkpoint directories (a task checkpoint, extracted)",
		Subcommands: []*cli.Command{{
			Name:      "inspect",
			Usage:     "verify a checkpoint directory and print what it holds",
			ArgsUsage: "DIR",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "json", Usage: "print the manifest as JSON instead of a summary"},
			},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return fmt.Errorf("usage: cocoon checkpoint inspect [--json] DIR: %w", errdefs.ErrInvalidArgument)
				}
				return inspectCheckpoint(c.App.Writer, c.Args().First(), c.Bool("json"))
			},
		}},
	}
}

// inspectCheckpoint verifies the checkpoint dir and prints its manifest
// to w, as a summary or as JSON. A checkpoint that fails verification
// still has printed what its manifest says, if that could be read, and
// the verification's error is returned.
func inspectCheckpoint(w io.Writer, dir string, asJSON bool) error {
	m, verr := checkpoint.Verify(dir)
	if verr != nil {
		var err error
		if m, err = checkpoint.ReadManifest(dir); err != nil {
			return verr
		}
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(m); err != nil {
			return err
		}
		return verr
	}
	if err := m.Describe(w); err != nil {
		return err
	}
	if verr != nil {
		fmt.Fprintln(w, "verified: failed")
		return verr
	}
	_, err := fmt.Fprintln(w, "verified: ok")
	return err
}
