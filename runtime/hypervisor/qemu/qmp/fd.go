package qmp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// QEMU runs with -sandbox on, and a migration must not depend on the paths
// QEMU may open: the host opens the files and hands QEMU the descriptors.
// QMP's getfd takes the descriptor that arrived (SCM_RIGHTS) with the bytes
// of the getfd command itself and files it under a name; "fd:<name>" in
// migrate and migrate-incoming then takes it back out of QEMU's table,
// which closes it when the migration ends. A name not consumed that way is
// released with CloseFile.

// maxFDName bounds a descriptor name; QEMU keeps it in the monitor's list.
const maxFDName = 64

// SendFile hands QEMU a duplicate of f's descriptor under name (QMP
// getfd). A name already in use is replaced by QEMU, closing the older
// descriptor. f stays the caller's to close. The client's connection must
// be a unix socket (errdefs.ErrNotImplemented otherwise).
func (c *Client) SendFile(ctx context.Context, name string, f *os.File) error {
	if err := validFDName(name); err != nil {
		return err
	}
	raw, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("qmp getfd %s: %w", name, err)
	}
	var rights []byte
	if err := raw.Control(func(fd uintptr) { rights = unix.UnixRights(int(fd)) }); err != nil {
		return fmt.Errorf("qmp getfd %s: %w: %w", name, errdefs.ErrInvalidArgument, err)
	}
	err = c.execute(ctx, "getfd", map[string]any{"fdname": name}, nil, rights)
	// The number in rights is f's until sendmsg has queued it (the
	// kernel then holds its own reference): f must not be collected,
	// and so closed, before.
	runtime.KeepAlive(f)
	return err
}

// CloseFile makes QEMU close the descriptor it holds under name (QMP
// closefd). A name QEMU does not hold fails with a *Error.
func (c *Client) CloseFile(ctx context.Context, name string) error {
	if err := validFDName(name); err != nil {
		return err
	}
	return c.Execute(ctx, "closefd", map[string]any{"fdname": name}, nil)
}

// validFDName accepts names QEMU's fd: URIs parse back: QEMU takes a name
// that starts with a digit for a descriptor number.
func validFDName(name string) error {
	if name == "" || len(name) > maxFDName || (name[0] >= '0' && name[0] <= '9') {
		return fmt.Errorf("%w: descriptor name %q must be 1 to %d characters and not start with a digit", errdefs.ErrInvalidArgument, name, maxFDName)
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
		default:
			return fmt.Errorf("%w: descriptor name %q holds %q", errdefs.ErrInvalidArgument, name, r)
		}
	}
	return nil
}

// writeWithRights writes msg with oob on its first bytes, then the rest
// if sendmsg took only part of it. The ancillary data goes once, with the
// first byte QEMU reads of the command, which is what getfd needs.
func writeWithRights(uc *net.UnixConn, msg, oob []byte) error {
	n, oobn, err := uc.WriteMsgUnix(msg, oob, nil)
	if err != nil {
		return err
	}
	if oobn != len(oob) {
		return errors.New("sendmsg: ancillary data cut short")
	}
	for n < len(msg) {
		m, err := uc.Write(msg[n:])
		if err != nil {
			return err
		}
		n += m
	}
	return nil
}
