// Command cocoon is Cocoon's admin CLI: check the host, run a command in a
// throwaway microVM, list and clean up sandboxes, inspect a checkpoint,
// make, list and remove templates, print the configuration, install on a
// Kubernetes node and print containerd's CRI configuration.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/containerd/log"
	"github.com/moby/sys/reexec"
	"github.com/urfave/cli/v2"

	"github.com/cocoonrt/cocoon/runtime/admin"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/containerdconfig"
	"github.com/cocoonrt/cocoon/runtime/version"
)

func main() {
	if reexec.Init() { // a network namespace holder
		return
	}
	app := &cli.App{
		Name:    "cocoon",
		Usage:   "containers in microVMs: host checks and administration",
		Version: version.Version,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "config file (default $COCOON_CONFIG, else " + config.DefaultPath + ")"},
			&cli.BoolFlag{Name: "debug", Usage: "log debug messages to stderr"},
		},
		Before: func(c *cli.Context) error {
			level := "warn"
			if c.Bool("debug") {
				level = "debug"
			}
			return log.SetLevel(level)
		},
		Commands: []*cli.Command{
			{
				Name:  "check",
				Usage: "report what this host offers and boot a throwaway VM to agent readiness",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "containerd-config", Usage: "the containerd config file whose CRI handler to report (default: containerd's, " + containerdconfig.DefaultPath + ")"},
				},
				Action: func(c *cli.Context) error {
					env, err := admin.LoadEnv(c.String("config"))
					if err != nil {
						return err
					}
					env.ContainerdConfig = c.String("containerd-config")
					return env.Check(c.Context, os.Stdout)
				},
			},
			{
				Name:      "run",
				Usage:     "run a command in a throwaway microVM and exit with its status",
				ArgsUsage: "[--] command [args...]",
				Flags: []cli.Flag{
					&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "KEY=VALUE for the guest process"},
					&cli.StringFlag{Name: "cwd", Usage: "working directory in the guest"},
				},
				Action: func(c *cli.Context) error {
					env, err := admin.LoadEnv(c.String("config"))
					if err != nil {
						return err
					}
					status, err := env.Run(c.Context, admin.RunOptions{
						Args: c.Args().Slice(), Env: c.StringSlice("env"), Cwd: c.String("cwd"),
						Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
					})
					if err != nil {
						return err
					}
					if status != 0 {
						return cli.Exit("", int(status))
					}
					return nil
				},
			},
			{
				Name:  "ps",
				Usage: "list sandboxes and whether their VM runs",
				Action: func(c *cli.Context) error {
					env, err := admin.LoadEnv(c.String("config"))
					if err != nil {
						return err
					}
					return env.PS(os.Stdout)
				},
			},
			{
				Name:  "gc",
				Usage: "remove the state of sandboxes whose VM is gone, then unused layer images and templates that can no longer be used",
				Flags: []cli.Flag{
					&cli.DurationFlag{Name: "layers-min-idle", Usage: "keep an unused layer image whose snapshot still exists until it has been unused this long (0: 24h; negative: remove at once)"},
				},
				Action: func(c *cli.Context) error {
					env, err := admin.LoadEnv(c.String("config"))
					if err != nil {
						return err
					}
					// Sandboxes first: a dead sandbox keeps its layers
					// referenced until its directories are gone.
					if err := env.GC(c.Context, os.Stdout); err != nil {
						return err
					}
					return errors.Join(
						env.GCLayers(c.Context, os.Stdout, c.Duration("layers-min-idle")),
						env.GCTemplates(c.Context, os.Stdout),
					)
				},
			},
			checkpointCommand(),
			templateCommand(),
			deployCommand(),
			containerdConfigCommand(),
			{
				Name:  "version",
				Usage: "print the version",
				Action: func(*cli.Context) error {
					fmt.Println("cocoon", version.Version)
					return nil
				},
			},
			{
				Name:  "config",
				Usage: "configuration",
				Subcommands: []*cli.Command{{
					Name:  "default",
					Usage: "print the compiled-in configuration as a config file",
					Action: func(*cli.Context) error {
						b, err := config.Default().TOML()
						if err != nil {
							return err
						}
						_, err = os.Stdout.Write(b)
						return err
					},
				}},
			},
		},
	}
	// SIGINT and SIGTERM end the context, so that a verb that started a
	// VM (run, check, template create) stops it rather than leave QEMU,
	// which runs in its own process group, behind.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := app.RunContext(ctx, os.Args)
	stop()
	if err != nil {
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "cocoon:", err)
		os.Exit(1)
	}
}
