package agent

import (
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// LinuxSystem is the System of a real guest.
type LinuxSystem struct {
	// Halt stops the guest. Init sets it to its own power-off, which
	// also unmounts what it mounted; nil means sync, then power off.
	Halt func() error
}

var _ System = LinuxSystem{}

// SetWallClock sets CLOCK_REALTIME.
func (LinuxSystem) SetWallClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
}

// AddEntropy writes b to the input pool and credits 8 bits per byte, then
// reseeds the CRNG from the pool. The host's bytes come from its own
// CSPRNG, so full credit is right; that is what lets getrandom() stop
// blocking in a guest restored from a template. The reseed is what makes
// the bytes count at once: the kernel otherwise keeps drawing from the
// CRNG state it had, and every guest restored from one snapshot has the
// same (vmgenid, which would reseed it, does not reach a microvm guest).
func (LinuxSystem) AddEntropy(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+(len(b)+3)/4*4)
	*(*int32)(unsafe.Pointer(&buf[0])) = int32(8 * len(b))
	*(*int32)(unsafe.Pointer(&buf[4])) = int32(len(b))
	copy(buf[8:], b)
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := sc.Control(func(fd uintptr) {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0])))
		if errno != 0 {
			ioErr = errno
		}
	}); err != nil {
		return err
	}
	if ioErr != nil {
		return fmt.Errorf("RNDADDENTROPY: %w", ioErr)
	}
	return reseedCRNG()
}

// reseedCRNG makes the kernel's CRNG take its next state from the input
// pool now (RNDRESEEDCRNG).
func reseedCRNG() error {
	f, err := os.OpenFile("/dev/random", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("RNDRESEEDCRNG: %w", err)
	}
	defer f.Close()
	sc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("RNDRESEEDCRNG: %w", err)
	}
	var ioErr error
	if err := sc.Control(func(fd uintptr) {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.RNDRESEEDCRNG, 0)
		if errno != 0 {
			ioErr = errno
		}
	}); err != nil {
		return fmt.Errorf("RNDRESEEDCRNG: %w", err)
	}
	if ioErr != nil {
		return fmt.Errorf("RNDRESEEDCRNG: %w", ioErr)
	}
	return nil
}

// SetHostname sets the hostname.
func (LinuxSystem) SetHostname(name string) error {
	return unix.Sethostname([]byte(name))
}

// PowerOff runs Halt; without one it refuses, so that an agent that is
// not the guest's init can never stop the machine it runs on.
func (l LinuxSystem) PowerOff() error {
	if l.Halt == nil {
		return errors.New("power off: no halt function configured")
	}
	return l.Halt()
}
