package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/cocoonrt/cocoon/runtime/agent"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

// The agent's readiness: the session's handover and its first call, which
// gives the guest its identity.

// connect reaches the agent, waits for it to answer and syncs the guest.
// It gives up as soon as the VMM exits or ctx ends, and the error then
// carries the tail of the guest console: that is where a guest that does
// not boot says why.
//
// resume says the VM was restored paused: it is resumed once the host is
// connected to the agent channel. conn, if set, is that channel already
// connected (a spare's, handed over); connect owns it.
func (s *Sandbox) connect(ctx context.Context, resume bool, conn net.Conn) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-s.vm.Exited():
			cancel(s.exitCause())
		case <-ctx.Done():
		}
	}()
	fail := func(step string, err error) error {
		// When the VMM dies, the agent channel often notices first; its
		// error says less than the VMM's exit, so wait a moment for it.
		select {
		case <-s.vm.Exited():
			err = s.exitCause()
		case <-time.After(exitGrace):
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				err = cause
			}
		}
		return fmt.Errorf("guest agent %s: %w%s", step, err, s.consoleTail())
	}

	began := time.Now()
	if conn == nil {
		var err error
		if conn, err = s.vm.AgentEndpoint().Dial(ctx); err != nil {
			return fail("connect", err)
		}
	}
	dialed := time.Now()
	if resume {
		if err := resumeVM(ctx, s.vm); err != nil {
			conn.Close()
			return fail("connect", err)
		}
	}
	// Connect waits for the agent to take the channel (its handshake):
	// a guest that never gets there is not ready.
	var err error
	s.agent, err = agent.Connect(ctx, conn)
	if err != nil {
		conn.Close()
		return fail("not ready", err)
	}
	handshaken := time.Now()
	// The session is the guest's: its first call both syncs the guest
	// and says it is ready (one round trip less than a ping first, which
	// under emulation is the first run of the agent's code after a
	// restore).
	if err := s.Sync(ctx); err != nil {
		return fail("not ready", err)
	}
	log.G(ctx).WithFields(log.Fields{
		"dial_ms": dialed.Sub(began).Milliseconds(), "handshake_ms": handshaken.Sub(dialed).Milliseconds(),
		"sync_ms": time.Since(handshaken).Milliseconds(),
	}).Debug("agent connected")
	return nil
}

// Sync gives the guest the host's wall clock, fresh entropy (credited
// and reseeded into the kernel's generator) and its hostname, and records
// what the guest says of itself. Start does it first on every new
// session: after a boot, a restore and a start from a template.
func (s *Sandbox) Sync(ctx context.Context) error {
	seed := make([]byte, 64)
	if _, err := rand.Read(seed); err != nil {
		return fmt.Errorf("entropy for guest: %w", err)
	}
	info, err := s.agent.SyncGuest(ctx, agent.GuestSync{WallTime: time.Now(), Entropy: seed, Hostname: s.ID})
	if err != nil {
		return err
	}
	s.Guest = info
	return nil
}

// exitCause describes the VMM's exit during start.
func (s *Sandbox) exitCause() error {
	why := "the guest shut down or reset"
	if err := s.vm.ExitError(); err != nil {
		why = err.Error()
	}
	return fmt.Errorf("%w before the agent was ready: %s", hypervisor.ErrVMExited, why)
}

func (s *Sandbox) consoleTail() string {
	if s.vm == nil {
		return ""
	}
	lines := s.vm.ConsoleTail(consoleTailLines)
	if len(lines) == 0 {
		return "\n(guest console is empty)"
	}
	return "\nlast guest console lines:\n  " + strings.Join(lines, "\n  ")
}

// resumeVM lets a VM restored or kept paused (a clone, a restore, a
// spare) run.
func resumeVM(ctx context.Context, vm hypervisor.VM) error {
	snap, ok := vm.(hypervisor.Snapshotter)
	if !ok {
		return fmt.Errorf("the restored VM cannot be resumed: %w", errdefs.ErrNotImplemented)
	}
	if err := snap.Resume(ctx); err != nil {
		return fmt.Errorf("resume the restored VM: %w", err)
	}
	return nil
}
