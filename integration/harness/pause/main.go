// Command pause is the sandbox (pause) process of the CRI tests' pods,
// their image's one binary (see harness.PauseImage): as PID 1 of a
// pod's PID namespace it reaps the children it inherits, and it exits 0
// on SIGINT or SIGTERM. Built static (CGO_ENABLED=0) when a test starts
// a CRI instance, so that no pod start pulls registry.k8s.io's.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap waits for every child that has exited; one SIGCHLD may stand for
// several.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
