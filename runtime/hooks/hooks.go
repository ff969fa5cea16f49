// Package hooks runs a container spec's OCI hooks on the host, the way runc
// does: the hooks of the runtime namespace (prestart, createRuntime,
// createContainer, poststart, poststop). startContainer hooks run in the
// guest and are not this package's.
//
// nerdctl's `nerdctl internal oci-hook createRuntime` (its CNI setup) and
// Docker's libnetwork prestart hook are the hooks this is for: each reads
// the container's state on stdin and works on the bundle and the network
// namespace the spec names. The caller (the shim) decides when each kind
// runs; this package only runs a list of them.
//
// A hook runs as its definition says and nothing more: its Path (absolute)
// with its Args as the whole argv and its Env as the whole environment
// (nothing of the shim's own), in the bundle directory, with the state on
// its stdin, one pipe to the shim as its stdout and stderr, and no other
// descriptor the shim opened (the shim's Go code opens everything
// close-on-exec; what the shim itself inherited without it would pass on,
// as to any child). It runs in a process group of its own, so that a
// timeout or the end of the caller's context kills whatever it started
// too; a hook that succeeds may leave a process behind, which is its own,
// and whose hold on the hook's output is not waited on. The output is kept
// only as far as an error needs it: its last 4 KiB.
package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Kind names a hook point as the runtime-spec does; it is also how errors
// and logs name the hooks being run.
type Kind string

// The hook points run on the host, in the order the runtime-spec has a
// container meet them.
const (
	// Prestart hooks run once the container's environment exists, before
	// createRuntime; deprecated by the runtime-spec, still what Docker's
	// libnetwork uses.
	Prestart Kind = "prestart"
	// CreateRuntime hooks run once the container's namespaces exist, before
	// its root is pivoted to; nerdctl sets up CNI here.
	CreateRuntime Kind = "createRuntime"
	// CreateContainer hooks run after createRuntime; runc runs them in the
	// container's mount namespace, this package in the shim's, as it does
	// every kind.
	CreateContainer Kind = "createContainer"
	// Poststart hooks run after the container's process has started; their
	// failures are warnings (use RunAll).
	Poststart Kind = "poststart"
	// Poststop hooks run after the container is deleted; their failures are
	// warnings (use RunAll).
	Poststop Kind = "poststop"
)

// Of returns h's hooks of kind k: nil for a nil h, or for a kind that is not
// one of this package's.
func Of(h *specs.Hooks, k Kind) []specs.Hook {
	if h == nil {
		return nil
	}
	switch k {
	case Prestart:
		return h.Prestart //nolint:staticcheck // deprecated, but Docker still sets it
	case CreateRuntime:
		return h.CreateRuntime
	case CreateContainer:
		return h.CreateContainer
	case Poststart:
		return h.Poststart
	case Poststop:
		return h.Poststop
	}
	return nil
}

// Validate checks the definition of every host hook of h (an absolute path,
// a timeout greater than zero if any) without running anything, so that a
// spec can be refused before any of its hooks has had an effect. Each bad
// hook is an error wrapping errdefs.ErrInvalidArgument; they are joined.
func Validate(h *specs.Hooks) error {
	var errs []error
	for _, k := range []Kind{Prestart, CreateRuntime, CreateContainer, Poststart, Poststop} {
		for i, hook := range Of(h, k) {
			errs = append(errs, validate(k, i, hook))
		}
	}
	return errors.Join(errs...)
}

// Run runs hooks, all of kind k, in order, each with state's JSON on its
// stdin, and stops at the first that fails: this is for createRuntime,
// createContainer and prestart, whose failure fails the container's
// creation. No hook runs if any of them is badly defined. A hook runs for
// at most its timeout, if it has one, and for no longer than ctx lasts.
//
// The error names the kind, the hook's index and path, how it failed and
// the end of what it printed. Its class, for a caller that turns it into a
// containerd error:
//   - errdefs.ErrInvalidArgument: a hook's definition is bad (a relative
//     path, a timeout not greater than zero); the spec is at fault.
//   - errdefs.ErrFailedPrecondition: a hook could not be started (its
//     binary is missing, say: errors.Is(err, fs.ErrNotExist) also holds),
//     exited with a non-zero status or on a signal (the *exec.ExitError is
//     wrapped too), or ran past its own timeout; what it was to set up is
//     not there, and trying again as is will not help.
//   - ctx's error (context.Canceled or context.DeadlineExceeded, which
//     errdefs already knows): ctx ended while a hook ran, and the hook was
//     killed.
func Run(ctx context.Context, k Kind, hooks []specs.Hook, state specs.State) error {
	var errs []error
	for i, h := range hooks {
		errs = append(errs, validate(k, i, h))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	stdin, err := json.Marshal(state)
	if err != nil {
		return fmt.Errorf("%s hooks: encode the container's state: %w", k, err)
	}
	for i, h := range hooks {
		if err := runOne(ctx, k, i, h, stdin, state.Bundle); err != nil {
			return err
		}
	}
	return nil
}

// RunAll runs every one of hooks, all of kind k, in order, each with
// state's JSON on its stdin, even when some fail: this is for poststart and
// poststop, whose failures the runtime-spec has the runtime log as
// warnings and carry on. It returns every failure (a bad definition
// included: that hook alone is skipped), each as Run describes it, joined
// with errors.Join; logging them is the caller's.
func RunAll(ctx context.Context, k Kind, hooks []specs.Hook, state specs.State) error {
	stdin, err := json.Marshal(state)
	if err != nil {
		return fmt.Errorf("%s hooks: encode the container's state: %w", k, err)
	}
	var errs []error
	for i, h := range hooks {
		if err := validate(k, i, h); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, runOne(ctx, k, i, h, stdin, state.Bundle))
	}
	return errors.Join(errs...)
}
