package task

import (
	"context"
	"fmt"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/oci"
)

// SandboxID returns the sandbox a container belongs to, and whether it
// joins one that another container made: a pod's containers join the
// pod's sandbox; a pod's sandbox container and a standalone container are
// a sandbox of their own, named after themselves.
func SandboxID(containerID string, annotations map[string]string) (id string, joins bool) {
	if annotations[oci.AnnotationCRIContainerType] == oci.CRIContainerTypeContainer {
		if sb := annotations[oci.AnnotationCRISandboxID]; sb != "" && sb != containerID {
			return sb, true
		}
	}
	return containerID, false
}

// sandboxFor returns the booted sandbox r.ID, booting it if r comes with
// the first container. Concurrent callers wait for the one boot; a failed
// boot is not kept, so the next Create tries again.
func (s *Service) sandboxFor(ctx context.Context, r LaunchRequest) (Sandbox, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("boot sandbox %s: the shim is shutting down: %w", r.ID, errdefs.ErrUnavailable)
	}
	slot := s.vm
	if slot != nil && slot.id != r.ID {
		s.mu.Unlock()
		return nil, fmt.Errorf("the container belongs to sandbox %s, but this shim serves sandbox %s: %w", r.ID, slot.id, errdefs.ErrFailedPrecondition)
	}
	boot := slot == nil
	if boot {
		slot = &vmSlot{id: r.ID, ready: make(chan struct{})}
		s.vm = slot
	}
	s.mu.Unlock()
	if boot {
		s.boot(ctx, slot, func(ctx context.Context) (Sandbox, error) { return s.launcher.Launch(ctx, r) })
	}
	select {
	case <-slot.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for sandbox %s to boot: %w", r.ID, ctx.Err())
	}
	if slot.err != nil {
		return nil, slot.err
	}
	return slot.sb, nil
}

// boot launches the VM of slot with launch (a boot, or a restore). The
// boot outlives the request that asked for it (other containers may wait
// for it); the sandbox's start timeout bounds it.
func (s *Service) boot(ctx context.Context, slot *vmSlot, launch func(context.Context) (Sandbox, error)) {
	ctx = context.WithoutCancel(ctx)
	log.G(ctx).WithField("sandbox", slot.id).Info("booting sandbox")
	sb, err := launch(ctx)
	s.mu.Lock()
	kept := s.vm == slot
	switch {
	case err != nil:
		slot.err = fmt.Errorf("boot sandbox %s: %w", slot.id, err)
		if kept {
			s.vm = nil
		}
	case !kept:
		// Close took the slot meanwhile: it stops sb (see stopVM).
		slot.err = fmt.Errorf("boot sandbox %s: the shim is shutting down: %w", slot.id, errdefs.ErrAborted)
		slot.sb = sb
	default:
		slot.sb = sb
	}
	close(slot.ready)
	s.mu.Unlock()
	if err == nil {
		go s.forwardEvents(sb)
	}
}

// forwardEvents publishes what the guest reports until the sandbox stops.
func (s *Service) forwardEvents(sb Sandbox) {
	for ev := range sb.Events() {
		switch ev.Kind {
		case EventOOM:
			s.mu.Lock()
			if c, ok := s.containers[ev.ContainerID]; ok {
				s.coalesceOOMLocked(c, ev.OOMKills)
			}
			s.mu.Unlock()
		default:
			log.G(s.ctx).WithField("kind", int(ev.Kind)).Debug("unknown sandbox event")
		}
	}
}

// publishOOMLocked publishes a TaskOOM for c unless the count of OOM kills
// was reported already: the guest reports a kill both as an event and with
// the init's exit, in either order. A count of 0 reports no kill and is
// dropped. Callers hold s.mu.
func (s *Service) publishOOMLocked(c *container, kills uint64) {
	if kills <= c.oomKills {
		return
	}
	c.oomKills = kills
	c.oomPublished = time.Now()
	s.publish(TopicOOM, &eventstypes.TaskOOM{ContainerID: c.id})
}

// coalesceOOMLocked publishes what a guest's OOM event reports, at most
// once per oomEventGap for each container: kills reported sooner are
// published together when the gap has passed. Callers hold s.mu.
func (s *Service) coalesceOOMLocked(c *container, kills uint64) {
	wait := oomEventGap - time.Since(c.oomPublished)
	if wait <= 0 {
		s.publishOOMLocked(c, kills)
		return
	}
	c.oomPending = max(c.oomPending, kills)
	if c.oomTimer != nil {
		return
	}
	c.oomTimer = time.AfterFunc(wait, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		c.oomTimer = nil
		if s.containers[c.id] == c && c.init.state != stateDeleted {
			s.publishOOMLocked(c, c.oomPending)
		}
	})
}

// oomEventGap is the least time between two TaskOOM events of a
// container that the guest's events cause: kills in between are
// coalesced into the next event, or into the one that precedes the
// init's exit, which is never held back. A guest cannot flood
// containerd with them.
const oomEventGap = 100 * time.Millisecond

// releaseVMIfUnusedLocked takes the VM out of the service once no
// container is left or being created; the caller stops it unlocked.
// Callers hold s.mu.
func (s *Service) releaseVMIfUnusedLocked() *vmSlot {
	if len(s.containers) > 0 || len(s.reserved) > 0 || s.vm == nil {
		return nil
	}
	vm := s.vm
	s.vm = nil
	return vm
}

// stopVM stops the VM of slot, once its boot has ended.
func stopVM(ctx context.Context, slot *vmSlot) error {
	if slot == nil {
		return nil
	}
	<-slot.ready
	if slot.sb == nil {
		return nil
	}
	log.G(ctx).WithField("sandbox", slot.id).Info("stopping sandbox")
	if err := slot.sb.Stop(ctx); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", slot.id, err)
	}
	return nil
}
