package qemu

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/channel"
)

// vhostVsockSetGuestCID is VHOST_VSOCK_SET_GUEST_CID, _IOW(0xAF, 0x60, __u64).
const vhostVsockSetGuestCID = 0x4008af60

// Guest CIDs are drawn from [minCID, maxCID]: 0-2 are reserved for the
// hypervisor, local and host, and 2^32-1 is VMADDR_CID_ANY.
const (
	minCID = 3
	maxCID = 1<<32 - 2
)

// cidAttempts bounds the search for a free CID. With 2^32 CIDs a collision
// is rare; many in a row mean something else is wrong.
const cidAttempts = 64

// reserveCID opens /dev/vhost-vsock and claims a random free guest CID on it.
// QEMU inherits the descriptor (vhostfd=) and sets the same CID again, which
// the kernel allows for the descriptor that holds it. Claiming it here,
// rather than letting QEMU fail with "address in use" and retrying a whole
// launch, turns a collision into a retried ioctl and needs no parsing of
// QEMU's messages.
func reserveCID(next func() uint32) (*os.File, uint32, error) {
	f, err := os.OpenFile(channel.VhostVsockDevice, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("open %s: %w", channel.VhostVsockDevice, err)
	}
	cid, err := claimCID(func(cid uint32) error { return setGuestCID(f, cid) }, next)
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, cid, nil
}

// claimCID tries random CIDs with set until one is free.
func claimCID(set func(uint32) error, next func() uint32) (uint32, error) {
	for range cidAttempts {
		cid := next()
		err := set(cid)
		if err == nil {
			return cid, nil
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			return 0, fmt.Errorf("claim vsock guest cid %d: %w", cid, err)
		}
	}
	return 0, fmt.Errorf("no free vsock guest cid after %d attempts", cidAttempts)
}

func setGuestCID(f *os.File, cid uint32) error {
	v := uint64(cid)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), vhostVsockSetGuestCID, uintptr(unsafe.Pointer(&v)))
	if errno != 0 {
		return errno
	}
	return nil
}

// randomCID draws a CID uniformly from [minCID, maxCID].
func randomCID() uint32 {
	return minCID + rand.Uint32N(maxCID-minCID+1)
}
