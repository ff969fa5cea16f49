package deploy

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/containerdconfig"
)

// configureContainerd adds the handler to containerd's configuration,
// checks with the host's containerd (`containerd config dump`) that it
// reads the handler, and restarts containerd. A check or a restart that
// fails puts the configuration back (and restarts containerd on it).
func (in *installer) configureContainerd(ctx context.Context) error {
	out, err := in.o.Host.Containerd(ctx, "--version")
	if err != nil {
		return fmt.Errorf("containerd on the host: %w", err)
	}
	major, minor, err := containerdconfig.ParseVersion(string(out))
	if err != nil {
		return err
	}
	version := fmt.Sprintf("containerd %d.%d", major, minor)
	path := in.o.ContainerdConfig
	before, err := containerdconfig.Read(in.o.HostRoot, path)
	if err != nil {
		return err
	}
	if un, _, err := containerdconfig.Uninstall(before); err == nil && un.Equal(before) && before.Main.Exists {
		// Nothing of install's there: containerd may have the handler
		// from a file of the node's own.
		if h, err := in.dump(ctx); err == nil && h.Found() {
			in.printf("%s: %s has the runtime %s already, not from cocoon deploy: left as it is", version, path, containerdconfig.Handler)
			return nil
		}
	}
	after, note, err := containerdconfig.Install(before, major)
	if err != nil {
		return err
	}
	if note != "" {
		in.printf("%s: %s", version, note)
	}
	changed := !after.Equal(before)
	if changed {
		if err := in.setRestartPending(true); err != nil {
			return err
		}
		if err := in.writeContainerdConfig(before, after); err != nil {
			return err
		}
	}
	h, err := in.dump(ctx)
	if err == nil && (!h.Found() || h.Problem() != "") {
		err = fmt.Errorf("%w: %s does not read the runtime %s from %s as written: %s", errdefs.ErrFailedPrecondition, version, containerdconfig.Handler, path, why(h, major))
	}
	if err != nil {
		if changed {
			err = errors.Join(err, containerdconfig.Write(in.o.HostRoot, after, before))
		}
		return err
	}
	in.printf("%s reads the runtime %s (runtime_type %s) in plugin %s", version, containerdconfig.Handler, h.Runtime.RuntimeType, h.Plugin)
	if !in.rec.RestartPending {
		return nil
	}
	if err := in.restart(ctx); err != nil {
		// containerd may be down on the new configuration: back to the
		// old one, and up again.
		if werr := containerdconfig.Write(in.o.HostRoot, after, before); werr != nil {
			return errors.Join(err, werr)
		}
		return errors.Join(err, in.restart(ctx))
	}
	return nil
}

// why says why a dump lacks the handler or has it wrong.
func why(h containerdconfig.DumpHandler, major int) string {
	switch {
	case h.Found():
		return h.Problem()
	case major == 1:
		return "an imported file with a table of plugin " + containerdconfig.PluginV2 + " replaces that of the main file, the handler with it (containerd 1.x replaces a plugin's table whole): add the runtime to that file by hand"
	}
	return "another file may set the CRI runtimes"
}

// writeContainerdConfig writes the edited files, the directories they
// need made and recorded first.
func (in *installer) writeContainerdConfig(before, after containerdconfig.Files) error {
	dirs := []string{filepath.Dir(after.Path)}
	if after.DropIn.Exists {
		dirs = append(dirs, filepath.Dir(containerdconfig.DropInPath(after.Path)))
	}
	for _, d := range dirs {
		if err := in.checkWritable(d); err != nil {
			return err
		}
		if err := in.mkdirs(d); err != nil {
			return err
		}
	}
	return containerdconfig.Write(in.o.HostRoot, before, after)
}

// unconfigureContainerd takes install's additions out of containerd's
// configuration, and restarts containerd if that changed it.
func (in *installer) unconfigureContainerd(ctx context.Context) error {
	before, err := containerdconfig.Read(in.o.HostRoot, in.o.ContainerdConfig)
	if err != nil {
		return err
	}
	after, note, err := containerdconfig.Uninstall(before)
	if err != nil {
		return err
	}
	if !after.Equal(before) {
		if err := in.ensureStateDir(); err != nil {
			return err
		}
		if err := in.setRestartPending(true); err != nil {
			return err
		}
		if err := containerdconfig.Write(in.o.HostRoot, before, after); err != nil {
			return err
		}
		in.printf("%s", note)
	}
	if !in.rec.RestartPending {
		return nil
	}
	return in.restart(ctx)
}

// restart restarts containerd, which clears a pending restart; without
// Options.Restart it says to.
func (in *installer) restart(ctx context.Context) error {
	if !in.o.Restart {
		in.printf("containerd's configuration changed: restart containerd for it to take effect")
		return in.setRestartPending(false)
	}
	if err := in.o.Host.RestartContainerd(ctx); err != nil {
		return fmt.Errorf("restart containerd: %w", err)
	}
	in.printf("restarted containerd")
	return in.setRestartPending(false)
}

func (in *installer) setRestartPending(v bool) error {
	if in.rec.RestartPending == v {
		return nil
	}
	in.rec.RestartPending = v
	return in.saveRecord()
}

// dump is what the host's containerd reads of the handler from its
// configuration.
func (in *installer) dump(ctx context.Context) (containerdconfig.DumpHandler, error) {
	out, err := in.o.Host.Containerd(ctx, "--config", in.o.ContainerdConfig, "config", "dump")
	if err != nil {
		return containerdconfig.DumpHandler{}, err
	}
	return containerdconfig.ParseDump(out, containerdconfig.Handler)
}
