package manager

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// protocol is how the containerd that runs `start` talks to a shim. Each
// containerd reads the answer on the start process's stdout (1.6 and 2.x
// read stdout and stderr combined, so start writes nothing else there):
//
//   - bare: containerd 1.6 reads the socket address as plain text
//     (runtime/v2/binary.go: strings.TrimSpace(out)). Runtime options, if
//     any, arrive on stdin as a protobuf Any.
//   - json: containerd 1.7 and 2.0-2.2 set MAX_SHIM_VERSION and accept
//     {"version":N,"address":...,"protocol":"ttrpc"}; 1.7 refuses N > 2,
//     2.x takes N = 3 as task API v3 and N = 2 as v2 (bridged). Both set
//     MAX_SHIM_VERSION=2, so N = min(3, MAX_SHIM_VERSION) = 2: task v2,
//     which every one of them speaks. Options arrive as with bare.
//   - bootstrap: containerd 2.3+ writes a protobuf BootstrapParams on
//     stdin (runtime options as an extension) and accepts a protobuf
//     BootstrapResult; a shim answering version 3 is spoken to in task v3.
//     Older callers' runtime options could parse as BootstrapParams too,
//     so the params count only if their instance id and namespace are the
//     command line's (as containerd 2.4's own pkg/shim checks).
type protocol int

const (
	protocolBare protocol = iota
	protocolJSON
	protocolBootstrap
)

func (p protocol) String() string {
	switch p {
	case protocolBare:
		return "bare address (containerd 1.6)"
	case protocolJSON:
		return "json (containerd 1.7, 2.0-2.2)"
	case protocolBootstrap:
		return "bootstrap protobuf (containerd 2.3+)"
	}
	return fmt.Sprintf("protocol(%d)", int(p))
}

// The task API versions: v3 is what containerd 2.x speaks natively.
const (
	taskAPIv2 = 2
	taskAPIv3 = 3
)

// defaultSocketDir is where containerd's shims put their sockets unless
// containerd says otherwise (BootstrapParams.socket_dir).
const defaultSocketDir = "/run/containerd/s"

// caller is what the containerd running `start` told the shim, and how it
// wants the answer.
type caller struct {
	// protocol is how to answer.
	protocol protocol
	// version is the task API version announced (json, bootstrap).
	version int32
	// grpcAddress and ttrpcAddress are containerd's.
	grpcAddress, ttrpcAddress string
	// socketDir is where the shim's socket goes.
	socketDir string
	// options are the runtime options; nil if none.
	options *anypb.Any
	// debug asks for debug logs.
	debug bool
}

// detectCaller works out the caller's protocol from what start was given:
// stdin, the environment and the command line.
func detectCaller(input []byte, f flags, getenv func(string) string) (caller, error) {
	c := caller{
		protocol:     protocolBare,
		grpcAddress:  f.address,
		ttrpcAddress: getenv("TTRPC_ADDRESS"),
		socketDir:    defaultSocketDir,
		debug:        f.debug,
	}
	if params, ok := parseBootstrapParams(input, f); ok {
		c.protocol, c.version = protocolBootstrap, taskAPIv3
		if a := params.GetContainerdGrpcAddress(); a != "" {
			c.grpcAddress = a
		}
		if a := params.GetContainerdTtrpcAddress(); a != "" {
			c.ttrpcAddress = a
		}
		if d := params.GetSocketDir(); d != "" {
			c.socketDir = d
		}
		c.debug = c.debug || params.GetLogLevel() <= bootapi.LogLevel_LOG_LEVEL_DEBUG
		c.options = runtimeOptionsExtension(params)
		return c, nil
	}
	if len(input) > 0 {
		var a anypb.Any
		if err := proto.Unmarshal(input, &a); err != nil {
			return caller{}, fmt.Errorf("runtime options on stdin: %w", err)
		}
		c.options = &a
	}
	if v := getenv("MAX_SHIM_VERSION"); v != "" {
		max, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return caller{}, fmt.Errorf("MAX_SHIM_VERSION=%q: not a number", v)
		}
		if max >= taskAPIv2 {
			c.protocol, c.version = protocolJSON, int32(min(max, taskAPIv3))
		}
	}
	return c, nil
}

// parseBootstrapParams decodes input as BootstrapParams meant for this
// shim instance.
func parseBootstrapParams(input []byte, f flags) (*bootapi.BootstrapParams, bool) {
	if len(input) == 0 {
		return nil, false
	}
	var params bootapi.BootstrapParams
	if err := proto.Unmarshal(input, &params); err != nil {
		return nil, false
	}
	if params.GetInstanceID() != f.id || params.GetNamespace() != f.namespace {
		return nil, false
	}
	return &params, true
}

// runtimeOptionsExtension returns the extension holding runtime options
// (containerd 2.3+ passes the runtime's options Any as is), or nil.
func runtimeOptionsExtension(params *bootapi.BootstrapParams) *anypb.Any {
	for _, ext := range params.GetExtensions() {
		if v := ext.GetValue(); v.MessageIs(&runtimeoptions.Options{}) {
			return v
		}
	}
	return nil
}

// answer is what start prints for a shim listening at address.
func (c caller) answer(address string) ([]byte, error) {
	switch c.protocol {
	case protocolBootstrap:
		return proto.Marshal(&bootapi.BootstrapResult{Version: c.version, Address: address, Protocol: "ttrpc"})
	case protocolJSON:
		return json.Marshal(struct {
			Version  int32  `json:"version"`
			Address  string `json:"address"`
			Protocol string `json:"protocol"`
		}{c.version, address, "ttrpc"})
	}
	return []byte(address), nil
}
