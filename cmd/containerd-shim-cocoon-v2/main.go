// Command containerd-shim-cocoon-v2 is Cocoon's containerd shim: the
// runtime io.containerd.cocoon.v2. See shim/manager.
package main

import (
	"os"

	"github.com/cocoonrt/cocoon/shim/manager"
)

func main() { os.Exit(manager.Main()) }
