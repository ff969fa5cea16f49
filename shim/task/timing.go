package task

import (
	"context"
	"time"
)

// timing is where the task calls of a container's init (Create, Start,
// Delete) spent their time, logged when the container is deleted: what
// the shim itself costs, next to the VM and the guest. Guarded by
// Service.mu.
type timing struct {
	// calls is the wall time of the calls.
	calls time.Duration
	// vm is booting the VM (or waiting for its boot) and stopping it.
	vm time.Duration
	// guest is the time of the guest agent calls made meanwhile
	// (Sandbox.GuestTime): the guest's work and the transport to it.
	guest time.Duration
}

// shim is the rest: the shim's own work on the host (spec and stdio, the
// layer cache, disk attach over QMP, events, state).
func (t timing) shim() time.Duration { return t.calls - t.vm - t.guest }

// callClock measures one task call of a container: its wall time, and
// the guest time of its sandbox meanwhile. Concurrent calls into one
// sandbox (a pod's containers) each count the other's guest time too.
type callClock struct {
	began  time.Time
	sb     Sandbox
	guest0 time.Duration
	vm     time.Duration
}

func startClock(sb Sandbox) callClock {
	c := callClock{began: time.Now(), sb: sb}
	if sb != nil {
		c.guest0 = sb.GuestTime()
	}
	return c
}

// guestFrom sets sb as the call's sandbox once it is known (Create boots
// it first), counting its guest time from now on.
func (c *callClock) guestFrom(sb Sandbox) {
	c.sb = sb
	c.guest0 = sb.GuestTime()
}

// addLocked adds the call to c's timing. Callers hold s.mu.
func (k callClock) addLocked(c *container) {
	c.timing.calls += time.Since(k.began)
	c.timing.vm += k.vm
	if k.sb != nil {
		c.timing.guest += k.sb.GuestTime() - k.guest0
	}
}

// logTiming reports the container's timing once it is deleted.
func logTiming(ctx context.Context, c *container, t timing) {
	logger(ctx, c.id, "").
		WithField("calls_ms", t.calls.Milliseconds()).
		WithField("vm_ms", t.vm.Milliseconds()).
		WithField("guest_ms", t.guest.Milliseconds()).
		WithField("shim_ms", t.shim().Milliseconds()).
		Info("container timing")
}
