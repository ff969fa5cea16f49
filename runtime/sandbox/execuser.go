package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/guest/execuser"
	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/agent"
	"github.com/cocoonrt/cocoon/runtime/config"
)

// userRetries is how many times a provisioning that failed is tried again
// in the background; userBackoff is the wait before the first retry,
// doubled before each next one.
const (
	userRetries = 5
	userBackoff = 250 * time.Millisecond
)

// userPolicy is a container's exec user, as its configuration says.
type userPolicy struct {
	user     agent.ExecUser
	required bool
	timeout  time.Duration
}

// userPolicyFor is the exec user of a container with annotations in a
// sandbox configured with cfg; nil when it has none.
func userPolicyFor(cfg config.ExecUser, annotations map[string]string) (*userPolicy, error) {
	c, err := oci.ExecUserFor(cfg, annotations)
	if err != nil || c.User == "" {
		return nil, err
	}
	u, err := execuser.Parse(c.User)
	if err != nil {
		return nil, fmt.Errorf("exec user: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	return &userPolicy{user: agent.ExecUser{User: u, Sudo: c.Sudo}, required: c.Required, timeout: c.Timeout.Duration}, nil
}

// userProvisioner runs a container's provisioning attempts after the
// first (CreateContainer's): at most one at a time, up to userRetries in
// the background with backoff, until one works, one fails in a way a
// retry cannot help, or the container or the sandbox stops.
//
// Its generation is a context, cancelled by cancel (the container's init
// exited) or stop (the container is deleted, the sandbox stops). Each
// retry captures it before it is scheduled and checks it again, under the
// lock, before it runs: no retry runs once the container stopped, even
// when its stop began while an attempt was in flight.
type userProvisioner struct {
	// attempt is one provisioning; retry says whether trying again may
	// help. It is given a context that the generation does not cancel:
	// an attempt under way finishes, within its own bound, so that the
	// guest is not left editing files of a container being deleted.
	attempt func(ctx context.Context) (retry bool, err error)
	// backoff is the wait before retry i (from 0).
	backoff func(i int) time.Duration
	logger  *log.Entry

	gen    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// inflight is closed when the attempt under way ends; nil when
	// none is.
	inflight chan struct{}
	// loopDone is closed when the retries ended.
	loopDone chan struct{}
}

func newUserProvisioner(logger *log.Entry, attempt func(context.Context) (bool, error)) *userProvisioner {
	gen, cancel := context.WithCancel(context.Background())
	return &userProvisioner{
		attempt: attempt,
		backoff: func(i int) time.Duration { return userBackoff << i },
		logger:  logger,
		gen:     gen, cancel: cancel,
		loopDone: make(chan struct{}),
	}
}

// retry starts the background retries.
func (p *userProvisioner) retry() {
	go p.loop(p.gen)
}

func (p *userProvisioner) loop(gen context.Context) {
	defer close(p.loopDone)
	// Once the retries end, so does the generation: the watch of the
	// init has nothing left to stop.
	defer p.cancel()
	for i := 0; i < userRetries; i++ {
		if gen.Err() != nil {
			return
		}
		t := time.NewTimer(p.backoff(i))
		select {
		case <-gen.Done():
			t.Stop()
			return
		case <-t.C:
		}
		done, ok := p.begin(gen)
		if !ok {
			return
		}
		retry, err := p.attempt(context.WithoutCancel(gen))
		p.end(done)
		if err == nil {
			p.logger.WithField("retry", i+1).Info("exec user provisioned on retry")
			return
		}
		if gen.Err() != nil {
			return
		}
		p.logger.WithError(err).WithField("retry", i+1).Warn("exec user not provisioned")
		if !retry {
			return
		}
	}
	p.logger.WithField("retries", userRetries).Warn("exec user not provisioned: giving up")
}

// begin marks an attempt in flight, unless the generation ended.
func (p *userProvisioner) begin(gen context.Context) (chan struct{}, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if gen.Err() != nil {
		return nil, false
	}
	p.inflight = make(chan struct{})
	return p.inflight, true
}

func (p *userProvisioner) end(done chan struct{}) {
	p.mu.Lock()
	p.inflight = nil
	p.mu.Unlock()
	close(done)
}

// wait returns once no attempt is in flight, or ctx ends: an exec waits
// for the user an attempt under way is making.
func (p *userProvisioner) wait(ctx context.Context) {
	p.mu.Lock()
	ch := p.inflight
	p.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// stop ends the retries and waits for an attempt in flight to finish.
func (p *userProvisioner) stop(ctx context.Context) {
	p.cancel()
	p.wait(ctx)
}

// provisionAttempt is one ProvisionUser call for ct, bounded by the
// policy's timeout.
func (s *Sandbox) provisionAttempt(ct *container, pol *userPolicy) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, pol.timeout)
		defer cancel()
		r, err := s.agent.ProvisionUser(ctx, ct.guest, pol.user)
		if err != nil {
			// A conflict with the image's entries, a read-only root or
			// a stopped container stay as they are; a guest that is
			// gone does not come back.
			retry := !errdefs.IsAlreadyExists(err) && !errdefs.IsFailedPrecondition(err) &&
				!errdefs.IsInvalidArgument(err) && !errdefs.IsNotFound(err) && !s.dead()
			return retry, err
		}
		logReport(log.G(ctx).WithField("user", pol.user.User.String()), r)
		return false, nil
	}
}

// userBound is how long the foreground provisioning of a container may
// take: the policy's timeout, and for the sandbox's first container no
// more than what is left of the sandbox's start deadline, which its boot
// and readiness spent from.
func (s *Sandbox) userBound(pol *userPolicy, first bool) (time.Duration, error) {
	bound := pol.timeout
	if first && !s.startDeadline.IsZero() {
		left := time.Until(s.startDeadline)
		if left <= 0 {
			return 0, fmt.Errorf("exec user %s: the sandbox's start deadline (runtime.start_timeout) is spent: %w", pol.user.User.Name, context.DeadlineExceeded)
		}
		bound = min(bound, left)
	}
	return bound, nil
}

// afterCreate takes the outcome of a container's first provisioning
// (CreateContainer's, or a restore's): the report logged, or the failure
// logged and, when a retry may help, a provisioner returned for the
// container, to be started once it is recorded.
func (s *Sandbox) afterCreate(ctx context.Context, ct *container, pol *userPolicy, out agent.UserOutcome) *userProvisioner {
	lg := log.G(ctx).WithField("user", pol.user.User.String())
	if out.Err == nil {
		if out.Report != nil {
			logReport(lg, *out.Report)
		}
		return nil
	}
	lg.WithError(out.Err).WithField("retry", out.Retry).Warn("exec user not provisioned")
	if !out.Retry {
		return nil
	}
	return newUserProvisioner(lg, s.provisionAttempt(ct, pol))
}

// start starts the retries, and a watch of init that ends them when it
// exits.
func (p *userProvisioner) start(init *agent.Process) {
	go func() {
		// Wait returns early, with an error, once the generation ends.
		if _, err := init.Wait(p.gen); err == nil {
			p.cancel()
		}
	}()
	p.retry()
}

// logReport logs what a provisioning did.
func logReport(lg *log.Entry, r agent.UserReport) {
	lg = lg.WithField("passwd", r.Passwd).WithField("group", r.Group).
		WithField("shadow", r.Shadow).WithField("home", r.Home).WithField("sudo", r.Sudo).
		WithField("guest_us", r.Took.Microseconds())
	for i, n := range r.Notes {
		lg = lg.WithField(fmt.Sprintf("note%d", i+1), n)
	}
	lg.Info("exec user provisioned")
}

// containerUser is the exec user to provision in container c, nil for
// none. A read-only root cannot take one: that fails the create of a
// required user and is a warning otherwise.
func (s *Sandbox) containerUser(ctx context.Context, c ContainerSpec) (*userPolicy, error) {
	pol, err := userPolicyFor(s.execUser, c.Spec.Annotations)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.ID, err)
	}
	if pol == nil {
		return nil, nil
	}
	if c.Spec.Root != nil && c.Spec.Root.Readonly {
		err := fmt.Errorf("exec user %s: the root filesystem is read-only, and the user is not added to it (docs/exec-user.md): %w",
			pol.user.User.Name, errdefs.ErrFailedPrecondition)
		if pol.required {
			return nil, fmt.Errorf("container %s: %w", c.ID, err)
		}
		log.G(ctx).WithError(err).Warn("exec user not provisioned")
		return nil, nil
	}
	return pol, nil
}

// provisionRestored provisions the exec user in a container restored
// from a checkpoint, whose snapshot may predate the user, before its
// processes are thawed. The first attempt is made here; a required user
// that fails it fails the restore.
func (s *Sandbox) provisionRestored(ctx context.Context, ct *container, spec ContainerSpec) error {
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("container", ct.id))
	pol, err := s.containerUser(ctx, spec)
	if err != nil || pol == nil {
		return err
	}
	var out agent.UserOutcome
	if bound, err := s.userBound(pol, true); err != nil {
		out.Err = err
	} else {
		actx, cancel := context.WithTimeout(ctx, bound)
		out.Retry, out.Err = s.provisionAttempt(ct, pol)(actx)
		cancel()
	}
	if out.Err != nil && pol.required {
		return fmt.Errorf("container %s: %w", ct.id, out.Err)
	}
	if p := s.afterCreate(ctx, ct, pol, out); p != nil {
		s.containers.mu.Lock()
		ct.user = p
		init := ct.init
		s.containers.mu.Unlock()
		p.start(init)
	}
	return nil
}

// userOf returns ct's provisioner, nil when it has none.
func (c *containers) userOf(ct *container) *userProvisioner {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ct.user
}
