// Package channel names the transports that carry the agent session between
// the host and the guest, chooses one for the host at hand, and dials it.
//
// vsock (vhost-vsock-pci) is preferred: it needs no device per connection and
// survives guest-side reopen. Hosts without /dev/vhost-vsock (nested clouds,
// some CI machines) fall back to a virtio-serial port that QEMU exposes as a
// unix socket on the host. Both carry the same yamux session, so nothing
// above this package knows which one is in use.
package channel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"
)

// Kind is a transport for the agent session.
type Kind string

const (
	// Vsock is AF_VSOCK through vhost-vsock.
	Vsock Kind = "vsock"
	// Serial is a virtio-serial port backed by a host unix socket.
	Serial Kind = "serial"
	// Auto picks Vsock when the host offers it, else Serial.
	Auto Kind = "auto"
)

// SerialPortName is the name of the virtio-serial port that carries the
// agent session; the guest finds it under /sys/class/virtio-ports.
const SerialPortName = "io.cocoon.agent.0"

// VsockPort is the vsock port the agent listens on.
const VsockPort uint32 = 1024

// VhostVsockDevice is the host device that vhost-vsock needs.
const VhostVsockDevice = "/dev/vhost-vsock"

// Endpoint says how the host reaches one guest's agent.
type Endpoint struct {
	Kind Kind
	// CID is the guest's vsock context id (Vsock only).
	CID uint32
	// Port is the agent's vsock port (Vsock only).
	Port uint32
	// SocketPath is the host unix socket of the serial port (Serial
	// only); it may be longer than a sockaddr_un holds (see DialUnix).
	SocketPath string
}

func (e Endpoint) String() string {
	if e.Kind == Vsock {
		return fmt.Sprintf("vsock cid %d port %d", e.CID, e.Port)
	}
	return fmt.Sprintf("virtio-serial %s", e.SocketPath)
}

// Dial connects to the endpoint. A vsock dial is retried until ctx ends,
// since the guest listens only once the agent is up; a serial socket is
// served by QEMU itself and data written to it waits in the port until the
// guest opens it, so one connect suffices.
func (e Endpoint) Dial(ctx context.Context) (net.Conn, error) {
	switch e.Kind {
	case Serial:
		c, err := DialUnix(ctx, e.SocketPath)
		if err != nil {
			return nil, fmt.Errorf("connect agent serial port %s: %w", e.SocketPath, err)
		}
		return c, nil
	case Vsock:
		backoff := 5 * time.Millisecond
		for {
			c, err := vsock.Dial(e.CID, e.Port, nil)
			if err == nil {
				return c, nil
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("connect agent vsock cid %d port %d: %w (last error: %v)", e.CID, e.Port, ctx.Err(), err)
			case <-time.After(backoff):
			}
			if backoff < 100*time.Millisecond {
				backoff *= 2
			}
		}
	}
	return nil, fmt.Errorf("unknown agent channel kind %q", e.Kind)
}

// Host reports what the host offers. Its fields are probes so that the
// selection logic can be tested without the devices.
type Host struct {
	// VhostVsock reports whether /dev/vhost-vsock can be opened.
	VhostVsock func() error
}

// LocalHost probes this machine.
func LocalHost() Host {
	return Host{VhostVsock: func() error {
		f, err := os.OpenFile(VhostVsockDevice, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		return f.Close()
	}}
}

// ErrUnavailable is returned when a transport asked for by name is not
// available on this host.
var ErrUnavailable = errors.New("agent channel unavailable")

// Select resolves want (auto, vsock or serial) for this host and says why.
func Select(want Kind, h Host) (Kind, string, error) {
	switch want {
	case Serial:
		return Serial, "configured", nil
	case Vsock:
		if err := h.VhostVsock(); err != nil {
			return "", "", fmt.Errorf("%w: channel = \"vsock\" but %s: %v", ErrUnavailable, VhostVsockDevice, err)
		}
		return Vsock, "configured", nil
	case Auto, "":
		if err := h.VhostVsock(); err != nil {
			return Serial, fmt.Sprintf("%s unusable (%v)", VhostVsockDevice, err), nil
		}
		return Vsock, VhostVsockDevice + " available", nil
	}
	return "", "", fmt.Errorf("unknown agent channel %q: want auto, vsock or serial", want)
}
