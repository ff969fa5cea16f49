// Command containerd-shim-cocoon-v2 is Cocoon's containerd shim: the
// runtime io.containerd.cocoon.v2. See shim/manager.
package main

import (
	"os"

	"github.com/moby/sys/reexec"

	"github.com/cocoonrt/cocoon/shim/manager"
)

func main() {
	if reexec.Init() { // a sandbox's network namespace holder
		return
	}
	os.Exit(manager.Main())
}
