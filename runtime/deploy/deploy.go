// Package deploy installs Cocoon on a Kubernetes node and removes it
// again, as the cocoon-deploy DaemonSet (deploy/kubernetes) runs it:
// Cocoon's files into place, the CRI runtime handler into containerd's
// configuration (package containerdconfig), containerd restarted, and
// the node labelled for the RuntimeClass's nodeSelector. Uninstall undoes
// each step, and only what install did: a record of the files it placed
// (with those it replaced) in the state directory, and markers in
// containerd's configuration.
package deploy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/containerdconfig"
)

const (
	// NodeLabel is the label install sets on its node, and the
	// RuntimeClass's scheduling.nodeSelector selects: pods of the
	// RuntimeClass go to nodes where Cocoon is installed.
	NodeLabel = "cocoon.io/runtime"
	// NodeLabelValue is its value.
	NodeLabelValue = "true"
	// DefaultStateDir is where install keeps its record and the files it
	// replaced.
	DefaultStateDir = "/var/lib/cocoon/deploy"
	// uninstallTimeout bounds Run's uninstall, which starts once the
	// pod is told to stop (terminationGracePeriodSeconds must be longer).
	uninstallTimeout = 100 * time.Second
)

// HostDirs are the host directories install writes under: the payload
// (make install's /usr/local/bin and /usr/local/share/cocoon),
// containerd's configuration, Cocoon's, and the state directory. The
// DaemonSet mounts each at the same path under its host root.
func HostDirs() []string {
	return []string{"/usr/local", "/etc/containerd", "/etc/cocoon", "/var/lib/cocoon"}
}

// Options say what to install where.
type Options struct {
	// HostRoot is where the host's filesystem is seen: "/" on the host,
	// "/host" in the DaemonSet, which mounts each of HostDirs under it.
	HostRoot string
	// Payload is a tree of files to place on the host at the same paths
	// (its usr/local/bin/cocoon at /usr/local/bin/cocoon); empty: none.
	Payload string
	// CocoonConfig, if set and there, is placed as Cocoon's config file
	// (/etc/cocoon/config.toml).
	CocoonConfig string
	// ContainerdConfig is containerd's main config file, as the host
	// names it.
	ContainerdConfig string
	// StateDir (a host path) holds the record of what install placed.
	StateDir string
	// Restart restarts containerd when its configuration changed.
	Restart bool
	// Node is the Kubernetes node to label; empty: none.
	Node string
	// Host reaches the host's containerd.
	Host Host
	// Nodes labels Node; needed when Node is set.
	Nodes NodeLabeler
}

// installer is one install or uninstall.
type installer struct {
	o   Options
	w   io.Writer
	rec record
}

func newInstaller(o Options, w io.Writer) (*installer, error) {
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if o.ContainerdConfig == "" {
		o.ContainerdConfig = containerdconfig.DefaultPath
	}
	for what, p := range map[string]string{"host root": o.HostRoot, "state directory": o.StateDir, "containerd config": o.ContainerdConfig} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("%s %q: %w: want an absolute path", what, p, errdefs.ErrInvalidArgument)
		}
	}
	if o.Host == nil || o.Node != "" && o.Nodes == nil {
		return nil, fmt.Errorf("deploy: %w: no host, or a node and no API server", errdefs.ErrInvalidArgument)
	}
	in := &installer{o: o, w: w}
	for _, p := range []string{o.StateDir, filepath.Dir(o.ContainerdConfig), config.DefaultPath} {
		if err := in.checkWritable(p); err != nil {
			return nil, err
		}
	}
	return in, in.loadRecord()
}

func (in *installer) printf(format string, a ...any) {
	fmt.Fprintf(in.w, "cocoon deploy: "+format+"\n", a...)
}

// hostPath is where this process sees the host path p.
func (in *installer) hostPath(p string) string {
	return filepath.Join(in.o.HostRoot, p)
}

// checkWritable refuses a host path that a container's install would
// write into its own filesystem instead of the host's: one outside
// HostDirs, or under one whose mount is missing. On the host itself
// (HostRoot "/") every path is the host's.
func (in *installer) checkWritable(p string) error {
	if in.o.HostRoot == "/" {
		return nil
	}
	for _, d := range HostDirs() {
		if p == d || strings.HasPrefix(p, d+"/") {
			if _, err := os.Stat(in.hostPath(d)); err != nil {
				return fmt.Errorf("%s: %w: %s is not mounted at %s", p, errdefs.ErrFailedPrecondition, d, in.hostPath(d))
			}
			return nil
		}
	}
	return fmt.Errorf("%s: %w: install writes only under %s, which the DaemonSet mounts", p, errdefs.ErrInvalidArgument, strings.Join(HostDirs(), ", "))
}

// Install places the payload and Cocoon's config, adds the handler to
// containerd's configuration and checks that containerd reads it,
// restarts containerd if its configuration changed, and labels the node.
// Run twice, it does what it did once. A failure leaves what was done
// before it for the next install or an uninstall.
func Install(ctx context.Context, o Options, w io.Writer) error {
	in, err := newInstaller(o, w)
	if err != nil {
		return err
	}
	if err := in.ensureStateDir(); err != nil {
		return err
	}
	if err := in.placeAll(); err != nil {
		return err
	}
	if err := in.configureContainerd(ctx); err != nil {
		return err
	}
	if o.Node != "" {
		if err := o.Nodes.SetNodeLabel(ctx, o.Node, NodeLabel, NodeLabelValue); err != nil {
			return err
		}
		in.printf("labelled node %s %s=%s", o.Node, NodeLabel, NodeLabelValue)
	}
	in.printf("installed")
	return nil
}

// Uninstall removes the node's label, takes the handler out of
// containerd's configuration (restarting containerd if that changed it),
// then removes the files install placed and puts back those it replaced.
// A label it cannot remove does not stop it; a containerd it cannot
// restart keeps the files, which that containerd may still run.
func Uninstall(ctx context.Context, o Options, w io.Writer) error {
	in, err := newInstaller(o, w)
	if err != nil {
		return err
	}
	var labelErr error
	if o.Node != "" {
		labelErr = o.Nodes.RemoveNodeLabel(ctx, o.Node, NodeLabel)
		if labelErr == nil {
			in.printf("removed the label %s of node %s", NodeLabel, o.Node)
		}
	}
	if err := in.unconfigureContainerd(ctx); err != nil {
		return errors.Join(labelErr, err)
	}
	if err := errors.Join(labelErr, in.unplace()); err != nil {
		return err
	}
	in.printf("uninstalled")
	return nil
}

// Run installs, waits for ctx to end (the pod told to stop), then
// uninstalls: the DaemonSet's command, whose pod's removal undoes the
// install.
func Run(ctx context.Context, o Options, w io.Writer) error {
	if err := Install(ctx, o, w); err != nil {
		return err
	}
	fmt.Fprintln(w, "cocoon deploy: waiting; SIGTERM uninstalls")
	<-ctx.Done()
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), uninstallTimeout)
	defer cancel()
	return Uninstall(uctx, o, w)
}

// placeAll places the payload's files and Cocoon's config.
func (in *installer) placeAll() error {
	if in.o.Payload != "" {
		err := filepath.WalkDir(in.o.Payload, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if !d.Type().IsRegular() {
				return fmt.Errorf("payload %s: %w: not a regular file", path, errdefs.ErrInvalidArgument)
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(in.o.Payload, path)
			if err != nil {
				return err
			}
			return in.place(path, "/"+filepath.ToSlash(rel), fi.Mode().Perm())
		})
		if err != nil {
			return err
		}
	}
	if in.o.CocoonConfig != "" {
		if _, err := os.Stat(in.o.CocoonConfig); err == nil {
			return in.place(in.o.CocoonConfig, config.DefaultPath, 0o644)
		}
	}
	return nil
}
