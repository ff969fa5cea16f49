//go:build ignore

// goinit: a Go stand-in for cocoon-agent as PID 1, used by bench-boot.sh to
// measure boot time with a realistically sized Go binary (initrd size, Go
// runtime start-up under emulation). It imports net/http only to have the
// size of a real agent. Build (static):
//
//	CGO_ENABLED=0 go build -trimpath -ldflags=-s -o goinit guest/image/testinit/goinit.go
package main

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
)

var _ = http.DefaultClient

func main() {
	_ = os.MkdirAll("/proc", 0o555)
	_ = syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "")
	up, _ := os.ReadFile("/proc/uptime")
	fmt.Printf("COCOON-TESTINIT-READY uptime=%s go=1\n", strings.TrimSpace(string(up)))
	syscall.Sync()
	_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART)
	select {}
}
