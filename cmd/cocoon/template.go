package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/cocoonrt/cocoon/runtime/admin"
	"github.com/cocoonrt/cocoon/runtime/nice"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// templateCommand is `cocoon template`: the templates sandboxes start
// from instead of booting (docs/templates.md).
func templateCommand() *cli.Command {
	return &cli.Command{
		Name:  "template",
		Usage: "templates: saved, booted guests that sandboxes of their shape start from",
		Subcommands: []*cli.Command{{
			Name:  "create",
			Usage: "boot a guest of the configured shape, save it as its shape's template",
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "vcpus", Usage: "vCPUs, instead of hypervisor.vcpus (as io.cocoon.vcpus)"},
				&cli.IntFlag{Name: "memory-mib", Usage: "guest memory in MiB, instead of hypervisor.memory_mib (as io.cocoon.memory_mib)"},
				&cli.BoolFlag{Name: "replace", Usage: "make it anew even if a valid template of the shape exists"},
				&cli.BoolFlag{Name: "auto", Usage: "a background creation: give way to one already running, record a failure"},
				&cli.StringFlag{Name: "key", Usage: "fail unless the shape's key is this one"},
			},
			Action: func(c *cli.Context) error {
				env, err := admin.LoadEnv(c.String("config"))
				if err != nil {
					return err
				}
				err = env.CreateTemplate(c.Context, os.Stdout, admin.TemplateOptions{
					VCPUs: c.Int("vcpus"), MemoryMiB: c.Int("memory-mib"), Key: c.String("key"),
					Replace: c.Bool("replace"), Automatic: c.Bool("auto"),
				})
				if c.Bool("auto") && errors.Is(err, template.ErrBusy) {
					fmt.Println("another template is being created; this one is left for a later boot")
					return nil
				}
				return err
			},
		}, {
			Name:   "spare",
			Usage:  "make the spare of the template of the configured shape and hold it until a sandbox takes it over (the shim runs it)",
			Hidden: true,
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "vcpus", Usage: "vCPUs, instead of hypervisor.vcpus (as io.cocoon.vcpus)"},
				&cli.IntFlag{Name: "memory-mib", Usage: "guest memory in MiB, instead of hypervisor.memory_mib (as io.cocoon.memory_mib)"},
				&cli.StringFlag{Name: "key", Usage: "the shape's key", Required: true},
			},
			Action: func(c *cli.Context) error {
				// A spare is made while the start that asked for it
				// goes on, and must not slow it: this process and its
				// QEMU run at the lowest priority, which the sandbox
				// that takes the QEMU over sets back to its own.
				if err := nice.Set(0, 19); err != nil {
					fmt.Fprintf(os.Stderr, "cocoon template spare: lower the priority: %v\n", err)
				}
				env, err := admin.LoadEnv(c.String("config"))
				if err != nil {
					return err
				}
				// SIGTERM and SIGINT stop the spare's VM before it exits.
				ctx, stop := signal.NotifyContext(c.Context, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
				defer stop()
				return env.RunSpare(ctx, os.Stdout, admin.TemplateOptions{
					VCPUs: c.Int("vcpus"), MemoryMiB: c.Int("memory-mib"), Key: c.String("key"),
				})
			},
		}, {
			Name:    "ls",
			Aliases: []string{"list"},
			Usage:   "list the templates, the records of failed creations, and which template the configured shape uses (*)",
			Action: func(c *cli.Context) error {
				if c.NArg() != 0 {
					return fmt.Errorf("usage: cocoon template ls: %w", errdefs.ErrInvalidArgument)
				}
				env, err := admin.LoadEnv(c.String("config"))
				if err != nil {
					return err
				}
				return env.ListTemplates(c.App.Writer)
			},
		}, {
			Name:      "rm",
			Usage:     "remove templates (sandboxes running from one keep running) and the records of their failed creations",
			ArgsUsage: "KEY... | --all",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "all", Usage: "remove every template and record"},
			},
			Action: func(c *cli.Context) error {
				if c.Bool("all") == (c.NArg() > 0) {
					return fmt.Errorf("usage: cocoon template rm KEY... | --all: %w", errdefs.ErrInvalidArgument)
				}
				env, err := admin.LoadEnv(c.String("config"))
				if err != nil {
					return err
				}
				return env.RemoveTemplates(c.App.Writer, c.Args().Slice(), c.Bool("all"))
			},
		}, {
			Name:      "inspect",
			Usage:     "print what a template holds; with --verify, check its files' digests",
			ArgsUsage: "KEY",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "json", Usage: "print the manifest as JSON instead of a summary"},
				&cli.BoolFlag{Name: "verify", Usage: "hash the files and check them against the manifest; fail if they differ"},
			},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return fmt.Errorf("usage: cocoon template inspect [--json] [--verify] KEY: %w", errdefs.ErrInvalidArgument)
				}
				env, err := admin.LoadEnv(c.String("config"))
				if err != nil {
					return err
				}
				return env.InspectTemplate(c.App.Writer, c.Args().First(), admin.InspectOptions{JSON: c.Bool("json"), Verify: c.Bool("verify")})
			},
		}},
	}
}
