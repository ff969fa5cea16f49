package vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/oci"
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
	exe, err := cliPath()
	if err != nil {
		lg.WithError(err).Warn("cannot make the template of this shape in the background")
		return
	}
	args := []string{}
	if path, err := ConfigPath(r.Options); err == nil && path != "" {
		args = append(args, "--config", path)
	}
	args = append(args, "template", "create", "--auto", "--key", key)
	if v, ok := r.Annotations[oci.AnnotationVCPUs]; ok {
		args = append(args, "--vcpus", v)
	}
	if v, ok := r.Annotations[oci.AnnotationMemoryMiB]; ok {
		args = append(args, "--memory-mib", v)
	}
	pid, err := store.Spawn(exe, args)
	if err != nil {
		lg.WithError(err).Warn("cannot make the template of this shape in the background")
		return
	}
	lg.WithField("pid", pid).WithField("log", filepath.Join(store.Dir(), template.LogName)).Info("making the template of this shape in the background")
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
