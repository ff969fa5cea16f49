package manager

import (
	"flag"
	"fmt"
	"io"

	"github.com/containerd/containerd/api/types"
	"google.golang.org/protobuf/proto"

	"github.com/cocoonrt/cocoon/runtime/version"
)

// flags are the shim's command line, as every containerd from 1.6 to 2.x
// passes it: -namespace, -address, -publish-binary, -id, then -bundle
// with delete, -debug at debug level, and the action last.
type flags struct {
	// namespace is the containerd namespace.
	namespace string
	// id is the container id (of the first container, for the server).
	id string
	// address is containerd's gRPC address.
	address string
	// publishBinary is containerd's binary; unused (events go over ttrpc).
	publishBinary string
	// bundle is the bundle directory (delete); start and the server run
	// in it.
	bundle string
	// socket makes the server listen on this path instead of fd 3.
	socket string
	// debug asks for debug logs.
	debug bool
	// version and info print what they name and exit.
	version, info bool
	// action is start, delete or empty (serve).
	action string
}

func parseFlags(args []string) (flags, error) {
	var f flags
	fs := flag.NewFlagSet(RuntimeName, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.namespace, "namespace", "", "namespace that owns the shim")
	fs.StringVar(&f.id, "id", "", "id of the task")
	fs.StringVar(&f.address, "address", "", "containerd's gRPC address")
	fs.StringVar(&f.publishBinary, "publish-binary", "", "containerd's binary (unused: events go over ttrpc)")
	fs.StringVar(&f.bundle, "bundle", "", "bundle path (delete)")
	fs.StringVar(&f.socket, "socket", "", "socket path to serve instead of fd 3")
	fs.String("debug-socket", "", "unused")
	fs.BoolVar(&f.debug, "debug", false, "debug logs")
	fs.BoolVar(&f.version, "v", false, "print the version")
	fs.BoolVar(&f.version, "version", false, "print the version")
	fs.BoolVar(&f.info, "info", false, "print the runtime info protobuf")
	if err := fs.Parse(args); err != nil {
		return flags{}, fmt.Errorf("command line: %w", err)
	}
	f.action = fs.Arg(0)
	return f, nil
}

func printVersion(w io.Writer) error {
	_, err := fmt.Fprintf(w, "containerd-shim-cocoon-v2:\n  Runtime: %s\n  Version: %s\n", RuntimeName, version.Version)
	return err
}

// printInfo answers `-info` (containerd 1.7+, introspection): a protobuf
// RuntimeInfo on stdout.
func printInfo(w io.Writer) error {
	data, err := proto.Marshal(&types.RuntimeInfo{
		Name:    RuntimeName,
		Version: &types.RuntimeVersion{Version: version.Version},
	})
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}
