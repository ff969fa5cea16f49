package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"github.com/cocoonrt/cocoon/runtime/containerdconfig"
	"github.com/cocoonrt/cocoon/runtime/deploy"
)

// deployFlags are install's, uninstall's and run's.
func deployFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "host-root", Value: "/", Usage: "where the host's filesystem is seen (the DaemonSet: /host, each of " + strings.Join(deploy.HostDirs(), ", ") + " mounted under it)"},
		&cli.StringFlag{Name: "payload", Usage: "a tree of files to place on the host at the same paths (the image's make install output); empty: none"},
		&cli.StringFlag{Name: "cocoon-config", Usage: "a file to place as /etc/cocoon/config.toml, when it exists"},
		&cli.StringFlag{Name: "containerd-config", Value: containerdconfig.DefaultPath, Usage: "containerd's main config file, as the host names it"},
		&cli.StringFlag{Name: "containerd", Value: "containerd", Usage: "the host's containerd binary"},
		&cli.BoolFlag{Name: "nsenter", Usage: "run containerd and the restart in the host's namespaces (nsenter -t 1; a container with hostPID)"},
		&cli.StringFlag{Name: "restart-command", Value: deploy.DefaultRestartCommand, Usage: "how to restart containerd when its configuration changed; empty: do not"},
		&cli.StringFlag{Name: "node", EnvVars: []string{"NODE_NAME"}, Usage: "the Kubernetes node to label " + deploy.NodeLabel + "=" + deploy.NodeLabelValue + ", through the API server with the pod's service account; empty: none"},
		&cli.StringFlag{Name: "state-dir", Value: deploy.DefaultStateDir, Usage: "where install records what it placed (a host path)"},
	}
}

func deployOptions(c *cli.Context) (deploy.Options, error) {
	restart := strings.Fields(c.String("restart-command"))
	o := deploy.Options{
		HostRoot: c.String("host-root"), Payload: c.String("payload"), CocoonConfig: c.String("cocoon-config"),
		ContainerdConfig: c.String("containerd-config"), StateDir: c.String("state-dir"),
		Restart: len(restart) > 0, Node: c.String("node"),
		Host: deploy.CommandHost{ContainerdPath: c.String("containerd"), NSEnter: c.Bool("nsenter"), Restart: restart},
	}
	if o.Node != "" {
		api, err := deploy.InCluster()
		if err != nil {
			return o, err
		}
		o.Nodes = api
	}
	return o, nil
}

// deployCommand is `cocoon deploy`: Cocoon onto a Kubernetes node and off
// it again (docs/kubernetes.md).
func deployCommand() *cli.Command {
	verb := func(name, usage string, f func(context.Context, deploy.Options, io.Writer) error) *cli.Command {
		return &cli.Command{
			Name: name, Usage: usage, Flags: deployFlags(),
			Action: func(c *cli.Context) error {
				o, err := deployOptions(c)
				if err != nil {
					return err
				}
				return f(c.Context, o, c.App.Writer)
			},
		}
	}
	return &cli.Command{
		Name:  "deploy",
		Usage: "install Cocoon on a Kubernetes node, or remove it: files, containerd's CRI handler, the node's label",
		Subcommands: []*cli.Command{
			verb("install", "place the files, add the CRI handler "+containerdconfig.Handler+" to containerd's configuration, restart containerd, label the node", deploy.Install),
			verb("uninstall", "undo what install did, and only that", deploy.Uninstall),
			verb("run", "install, wait for SIGTERM, uninstall: the DaemonSet's command", deploy.Run),
		},
	}
}

// containerdConfigCommand is `cocoon containerd-config`: the CRI handler's
// configuration for a containerd config version.
func containerdConfigCommand() *cli.Command {
	return &cli.Command{
		Name:  "containerd-config",
		Usage: "print containerd's CRI configuration for the runtime handler " + containerdconfig.Handler,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "version", Usage: "containerd config version: 2 (containerd 1.6, 1.7), 3 (2.x) or 4 (2.4); 0: the layout of the containerd on the PATH"},
		},
		Action: func(c *cli.Context) error {
			v := c.Int("version")
			if v == 0 {
				out, err := exec.CommandContext(c.Context, "containerd", "--version").Output()
				if err != nil {
					return fmt.Errorf("containerd --version: %v: %w: give --version", err, errdefs.ErrInvalidArgument)
				}
				major, _, err := containerdconfig.ParseVersion(string(out))
				if err != nil {
					return err
				}
				l, err := containerdconfig.LayoutForContainerd(major)
				if err != nil {
					return err
				}
				v = l.Version()
			}
			s, err := containerdconfig.Snippet(v)
			if err != nil {
				return err
			}
			_, err = io.WriteString(os.Stdout, s)
			return err
		},
	}
}
