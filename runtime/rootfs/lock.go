package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// fileLock is an flock(2) lock on one file. flock locks belong to the open
// file description, so two goroutines of one process exclude each other
// just as two processes do.
type fileLock struct {
	f *os.File
}

// lockPollMax caps the wait between two attempts to take a busy lock.
const lockPollMax = 100 * time.Millisecond

// lockFile takes an flock of kind how (unix.LOCK_SH or unix.LOCK_EX) on
// path, creating the file if need be. flock(2) cannot be interrupted, so a
// busy lock is polled, and ctx bounds the wait.
func lockFile(ctx context.Context, path string, how int) (*fileLock, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	wait := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return &fileLock{f: f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
		case <-t.C:
		}
		wait = min(wait*2, lockPollMax)
	}
}

// Unlock releases the lock.
func (l *fileLock) Unlock() error {
	// Closing the only descriptor of the open file description drops
	// the lock.
	return l.f.Close()
}
