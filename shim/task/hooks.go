package task

import (
	"context"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/hooks"
)

// hostHooks are a container's OCI hooks that run on the host, with what
// their state carries. The shim runs them where runc would: prestart,
// createRuntime and createContainer before the container is created
// (for the sandbox's first container, before its VM boots: they fill the
// network namespace the VM mirrors), poststart after its start, and
// poststop after its delete, or after a create that failed once they had
// run. Their pid is the sandbox's (Sandbox.HookPID): a process in its
// network namespace.
type hostHooks struct {
	id, bundle  string
	hooks       *specs.Hooks
	annotations map[string]string
}

// hostHooksOf is spec's hooks that run on the host; nil for none.
func hostHooksOf(id, bundle string, spec *specs.Spec) *hostHooks {
	if !oci.HasHostHooks(spec.Hooks) {
		return nil
	}
	return &hostHooks{id: id, bundle: bundle, hooks: spec.Hooks, annotations: spec.Annotations}
}

func (h *hostHooks) state(status specs.ContainerState, pid int) specs.State {
	return specs.State{Version: specs.Version, ID: h.id, Status: status, Pid: pid, Bundle: h.bundle, Annotations: h.annotations}
}

// afterHooksTimeout bounds the poststart or poststop hooks of a
// container, for hooks without a timeout of their own: they are not
// cancelled with the request that runs them (a delete's poststop must run
// to release what createRuntime took), and must not hang the shim.
const afterHooksTimeout = 2 * time.Minute

// create runs the hooks of the container's creation, in runc's order; the
// first that fails fails the create, with its output.
func (h *hostHooks) create(ctx context.Context, pid int) error {
	if h == nil {
		return nil
	}
	st := h.state(specs.StateCreating, pid)
	for _, k := range []hooks.Kind{hooks.Prestart, hooks.CreateRuntime, hooks.CreateContainer} {
		if err := hooks.Run(ctx, k, hooks.Of(h.hooks, k), st); err != nil {
			return err
		}
	}
	return nil
}

// after runs the poststart or poststop hooks: each runs, and failures are
// warnings, as the runtime-spec has them.
func (h *hostHooks) after(ctx context.Context, k hooks.Kind, status specs.ContainerState, pid int) {
	if h == nil {
		return
	}
	list := hooks.Of(h.hooks, k)
	if len(list) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), afterHooksTimeout)
	defer cancel()
	if err := hooks.RunAll(ctx, k, list, h.state(status, pid)); err != nil {
		logger(ctx, h.id, "").WithError(err).Warnf("%s hooks failed", k)
	}
}
