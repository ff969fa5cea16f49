package qmp

import (
	"context"
	"errors"
	"fmt"
)

// Event names the product reacts to.
const (
	EventShutdown      = "SHUTDOWN"
	EventStop          = "STOP"
	EventResume        = "RESUME"
	EventReset         = "RESET"
	EventGuestPanicked = "GUEST_PANICKED"
)

// Version is QEMU's version as reported by query-version and the greeting.
type Version struct {
	QEMU struct {
		Major int `json:"major"`
		Minor int `json:"minor"`
		Micro int `json:"micro"`
	} `json:"qemu"`
	// Package is the distribution's package version, e.g.
	// "Debian 1:7.2+dfsg-7+deb12u18".
	Package string `json:"package"`
}

func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d", v.QEMU.Major, v.QEMU.Minor, v.QEMU.Micro)
}

// Status is the reply of query-status.
type Status struct {
	// Running is true while vCPUs execute.
	Running bool `json:"running"`
	// Status is QEMU's run state: "running", "paused", "prelaunch",
	// "inmigrate", "postmigrate", "shutdown", "guest-panicked", ...
	Status string `json:"status"`
}

// ShutdownData is the payload of a SHUTDOWN event.
type ShutdownData struct {
	// Guest is true when the guest initiated the shutdown.
	Guest bool `json:"guest"`
	// Reason is QEMU's ShutdownCause: "guest-shutdown", "guest-reset",
	// "guest-panic", "host-qmp-quit", "host-signal", ...
	Reason string `json:"reason"`
}

// QueryStatus reports whether the guest runs.
func (c *Client) QueryStatus(ctx context.Context) (Status, error) {
	var s Status
	err := c.Execute(ctx, "query-status", nil, &s)
	return s, err
}

// QueryVersion reports QEMU's version.
func (c *Client) QueryVersion(ctx context.Context) (Version, error) {
	var v Version
	err := c.Execute(ctx, "query-version", nil, &v)
	return v, err
}

// Stop pauses the guest's vCPUs.
func (c *Client) Stop(ctx context.Context) error {
	return c.Execute(ctx, "stop", nil, nil)
}

// Cont resumes the guest's vCPUs.
func (c *Client) Cont(ctx context.Context) error {
	return c.Execute(ctx, "cont", nil, nil)
}

// Quit makes QEMU exit at once, without telling the guest. QEMU may close
// the connection before or after replying, so QEMU closing it counts as
// success.
func (c *Client) Quit(ctx context.Context) error {
	err := c.Execute(ctx, "quit", nil, nil)
	if errors.Is(err, ErrClosed) && !errors.Is(c.Err(), errClosedByClient) {
		return nil
	}
	return err
}

// SystemPowerdown asks the guest to power off (an ACPI power-button press);
// the guest may ignore it.
func (c *Client) SystemPowerdown(ctx context.Context) error {
	return c.Execute(ctx, "system_powerdown", nil, nil)
}
