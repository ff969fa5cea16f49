package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/cocoonrt/cocoon/runtime/admin"
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
		}},
	}
}
