package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/guest/api"
	"github.com/cocoonrt/cocoon/guest/execuser"
)

// opProvision is a provisioning of the exec user in a created container:
// it edits the root filesystem's files, so it excludes the container's
// delete and export, and waits for thawed filesystems.
var opProvision = lifecycleOp{doing: "provisioned", from: []containerState{stateCreated, stateRunning, statePaused}, stay: true,
	rule: "the exec user can only be provisioned in a container that has not stopped", needsThawed: true}

// userFiles is what a container sees of its root filesystem's user
// files.
type userFiles struct {
	// readonly is root.readonly: the files cannot be edited.
	readonly bool
	// hiddenBy is the destination of the container's mount that hides
	// them (on /etc or one of the files), "" when none does.
	hiddenBy string
}

func userFilesOf(spec *bundleSpec) (userFiles, error) {
	dests, err := spec.mountDestinations()
	if err != nil {
		return userFiles{}, err
	}
	return userFiles{readonly: spec.ReadonlyRoot, hiddenBy: execuser.Covering(dests)}, nil
}

// unreachable says why provisioning cannot reach what the container will
// see of its user files, "" when it can.
func (f userFiles) unreachable() string {
	switch {
	case f.readonly:
		return "the root filesystem is read-only"
	case f.hiddenBy != "":
		return fmt.Sprintf("the container's mount on %s hides the root filesystem's user files", f.hiddenBy)
	}
	return ""
}

// withHome sets HOME in process p (a spec's process object) when its
// environment has none, as runc does: the home of its uid's entry in the
// root filesystem at root, or "/" when it has none. With the user files
// hidden by a mount the lookup would read the wrong file, and p is left
// to the OCI runtime.
// It reports whether it set HOME.
func withHome(p rawObject, root string, f userFiles) (bool, error) {
	if f.hiddenBy != "" || p == nil {
		return false, nil
	}
	var env []string
	if err := p.get("env", &env); err != nil {
		return false, err
	}
	for _, e := range env {
		if strings.HasPrefix(e, "HOME=") {
			return false, nil
		}
	}
	var user struct {
		UID uint32 `json:"uid"`
	}
	if err := p.get("user", &user); err != nil {
		return false, err
	}
	home := "/"
	if e, err := execuser.LookupUID(root, user.UID); err == nil && e != nil && e.Home != "" {
		home = e.Home
	}
	return true, p.set("env", append(env, "HOME="+home))
}

// provisionUser provisions u in the root filesystem at root, within
// timeout (0: ctx's deadline alone), and reports what it did.
func provisionUser(ctx context.Context, root string, u *api.ExecUser, timeout time.Duration) (*api.ExecUserReport, error) {
	if u == nil {
		return nil, fmt.Errorf("no exec user given: %w", errdefs.ErrInvalidArgument)
	}
	user := execuser.User{Name: u.Name, UID: u.Uid, GID: u.Gid, Home: u.Home, Shell: u.Shell}
	if err := user.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	began := time.Now()
	rep, err := execuser.Provision(ctx, root, user, execuser.Options{Sudo: u.Sudo})
	took := time.Since(began)
	if err != nil {
		return nil, provisionError(err)
	}
	out := &api.ExecUserReport{
		Passwd: string(rep.Passwd), Group: string(rep.Group), Shadow: string(rep.Shadow),
		Home: string(rep.Home), Sudo: string(rep.Sudo),
		ByName: entryLine(rep.ByName), ByUid: entryLine(rep.ByUID),
		Notes: rep.Notes, TookNs: uint64(took),
	}
	log.G(ctx).WithField("user", user.String()).WithField("passwd", rep.Passwd).WithField("sudo", rep.Sudo).
		WithField("took_us", took.Microseconds()).Info("exec user provisioned")
	return out, nil
}

// provisionError gives a provisioning error the code that tells the host
// whether a retry may help: a conflict with the image's own entries or an
// unsafe file will not change.
func provisionError(err error) error {
	switch {
	case errors.Is(err, execuser.ErrConflict):
		return fmt.Errorf("%w: %w", errdefs.ErrAlreadyExists, err)
	case errors.Is(err, execuser.ErrUnsafe):
		return fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
	}
	return err
}

// retryMayHelp says whether a provisioning that failed with err may work
// when tried again.
func retryMayHelp(err error) bool {
	return !errdefs.IsAlreadyExists(err) && !errdefs.IsFailedPrecondition(err) && !errdefs.IsInvalidArgument(err)
}

// entryLine is e as a passwd line, "" for none.
func entryLine(e *execuser.Entry) string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf("%s:x:%d:%d::%s:%s", e.Name, e.UID, e.GID, e.Home, e.Shell)
}

// provisionAtCreate is CreateContainer's provisioning, in the assembled
// root before the runtime's create. A failure that is not required is
// returned in the response, not as the call's error.
func provisionAtCreate(ctx context.Context, id string, files userFiles, root string, req *api.CreateContainerRequest, resp *api.CreateContainerResponse) error {
	var err error
	if why := files.unreachable(); why != "" {
		err = fmt.Errorf("%s: %w", why, errdefs.ErrFailedPrecondition)
	} else {
		resp.ExecUser, err = provisionUser(ctx, root, req.ExecUser, time.Duration(req.ExecUserTimeoutNs))
	}
	if err == nil {
		return nil
	}
	if req.ExecUserRequired {
		return fmt.Errorf("container %s: exec user %s: %w", id, req.ExecUser.GetName(), err)
	}
	log.G(ctx).WithError(err).WithField("user", req.ExecUser.GetName()).Warn("exec user not provisioned")
	resp.ExecUserError = err.Error()
	resp.ExecUserRetry = retryMayHelp(err)
	return nil
}

// ProvisionUser provisions the exec user in a created container.
func (s *Service) ProvisionUser(ctx context.Context, req *api.ProvisionUserRequest) (*api.ExecUserReport, error) {
	c, err := s.containers.get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	if why := c.userFiles.unreachable(); why != "" {
		return nil, fmt.Errorf("container %s: exec user: %s: %w", c.id, why, errdefs.ErrFailedPrecondition)
	}
	if err := c.begin(opProvision); err != nil {
		if c.current() == stateStopped {
			return nil, err
		}
		// Busy with another op, or frozen for a checkpoint: a retry
		// may find it free.
		return nil, fmt.Errorf("%w: %v", errdefs.ErrAborted, err)
	}
	rep, err := provisionUser(log.WithLogger(ctx, log.G(ctx).WithField("container", c.id)), c.rootfs.Root, req.User, 0)
	c.end(opProvision, err == nil)
	if err != nil {
		return nil, fmt.Errorf("container %s: exec user %s: %w", c.id, req.User.GetName(), err)
	}
	return rep, nil
}

// processWithHome is an exec's process (data, decoded as raw) with HOME
// set as withHome sets it; data as it is when it has HOME already.
func processWithHome(data []byte, raw rawObject, c *container) ([]byte, error) {
	set, err := withHome(raw, c.rootfs.Root, c.userFiles)
	if err != nil || !set {
		return data, err
	}
	return json.Marshal(raw)
}
