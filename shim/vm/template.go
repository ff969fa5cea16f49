package vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/sandbox"
	"github.com/cocoonrt/cocoon/runtime/template"
	"github.com/cocoonrt/cocoon/shim/task"
)

// CLIName is the cocoon command, which the shim runs to make templates;
// it is looked for next to the shim's executable, then on PATH.
const CLIName = "cocoon"

// makeTemplate starts the creation of the template of key in the
// background after a boot in auto mode: `cocoon template create --auto`,
// detached, with the sandbox's configuration (the same config file, the
// environment it inherits, the annotations that size the VM). It never
// waits: the start that caused it is done. A creation of the key that
// failed recently is not tried again (template.FailureBackoff); the
// child itself gives way to a creation already running, so four
// sandboxes booting at once make one template.
func (l Launcher) makeTemplate(ctx context.Context, store *template.Store, r task.LaunchRequest, key string) {
	lg := log.G(ctx).WithField("key", key)
	if f := store.Failure(key); f != nil && time.Since(f.Time) < template.FailureBackoff {
		lg.WithField("failed_at", f.Time).WithField("error", f.Error).Warn("not making the template of this shape: its last creation failed; `cocoon template create` tries again")
		return
	}
	pid, err := spawnCLI(store, r, "create", "--auto", "--key", key)
	if err != nil {
		lg.WithError(err).Warn("cannot make the template of this shape in the background")
		return
	}
	lg.WithField("pid", pid).WithField("log", filepath.Join(store.Dir(), template.LogName)).Info("making the template of this shape in the background")
}

// makeSpare starts the spare of template key in the background after a
// start from the template, so that the next sandbox of its shape takes
// it over: `cocoon template spare`, detached, with the sandbox's
// configuration as makeTemplate passes it. It never waits; the child
// gives way to a spare of the key already there.
func (l Launcher) makeSpare(ctx context.Context, store *template.Store, r task.LaunchRequest, stateDir, key string) {
	lg := log.G(ctx).WithField("key", key)
	if sandbox.SpareHeld(stateDir, key) {
		lg.Debug("a spare of this shape is there or being made")
		return
	}
	pid, err := spawnCLI(store, r, "spare", "--key", key)
	if err != nil {
		lg.WithError(err).Warn("cannot make the spare of this shape")
		return
	}
	lg.WithField("pid", pid).Debug("making the spare of this shape in the background")
}

// spawnCLI starts `cocoon template <args>` detached (template.Store.Spawn)
// with the sandbox's configuration: the same config file, the
// environment the shim has, the annotations that size the VM.
func spawnCLI(store *template.Store, r task.LaunchRequest, args ...string) (int, error) {
	exe, err := cliPath()
	if err != nil {
		return 0, err
	}
	var argv []string
	if path, err := ConfigPath(r.Options); err == nil && path != "" {
		argv = append(argv, "--config", path)
	}
	argv = append(argv, "template")
	argv = append(argv, args...)
	if v, ok := r.Annotations[oci.AnnotationVCPUs]; ok {
		argv = append(argv, "--vcpus", v)
	}
	if v, ok := r.Annotations[oci.AnnotationMemoryMiB]; ok {
		argv = append(argv, "--memory-mib", v)
	}
	return store.Spawn(exe, argv)
}

// cliPath finds the cocoon command.
func cliPath() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), CLIName)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return exec.LookPath(CLIName)
}
