// Command containerd-shim-cocoon-v2 is Cocoon's containerd shim: the
// runtime io.containerd.cocoon.v2. See shim/manager.
package main

import (
	"os"

	"github.com/moby/sys/reexec"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/shim/manager"
)

func main() {
	if reexec.Init() { // a sandbox's network namespace holder
		return
	}
	// What the shim inherited (containerd's socket, its parent's
	// descriptors) is its own, not its children's: the OCI hooks, QEMU
	// and virtiofsd get only what is handed to them.
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	os.Exit(manager.Main())
}
