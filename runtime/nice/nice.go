// Package nice sets the scheduling priority of a whole process. A Linux
// nice value belongs to a thread, and a thread or process inherits the
// one of the thread that made it: setpriority(PRIO_PROCESS, pid) alone
// changes one thread of a multi-threaded process.
package nice

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Own is the calling thread's nice value.
func Own() (int, error) {
	// The system call returns 20 - nice.
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		return 0, err
	}
	return 20 - prio, nil
}

// Set gives every thread of process pid (0: this one) the nice value n.
// Threads that exit meanwhile are skipped; one made meanwhile inherits
// from the thread that made it.
func Set(pid, n int) error {
	dir := "/proc/self/task"
	if pid != 0 {
		dir = "/proc/" + strconv.Itoa(pid) + "/task"
	}
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("thread %d: %w", tid, err))
		}
	}
	return errors.Join(errs...)
}
