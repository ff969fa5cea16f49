// Package vm is the shim's one typed wrapper around runtime/sandbox: it
// turns what containerd passes (runtime options, annotations) into Cocoon's
// configuration, boots the sandbox, and adapts it to the Task service's
// Sandbox interface. The Task service never touches runtime/sandbox
// itself.
package vm

import (
	"fmt"
	"path/filepath"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/config"
)

// LoadConfig builds the configuration of a sandbox, in runtime/config's
// precedence: the annotations (io.cocoon.*) over the runtime options over
// the environment over the file over the defaults.
//
// The runtime options are what containerd passes for the runtime: a
// runtimeoptions.v1.Options, the type containerd uses for runtimes other
// than runc (CRI's [...runtimes.cocoon.options] table, ctr's
// --runtime-config-path). Its ConfigPath names the config file to read
// instead of /etc/cocoon/config.toml. Options of another type are ignored:
// they are meant for another runtime.
func LoadConfig(options *anypb.Any, annotations map[string]string, getenv func(string) string) (config.Config, error) {
	path, err := ConfigPath(options)
	if err != nil {
		return config.Config{}, err
	}
	cfg, err := config.Load(path, getenv)
	if err != nil {
		return config.Config{}, err
	}
	// ApplyAnnotations validates the result.
	return oci.ApplyAnnotations(cfg, annotations)
}

// ConfigPath returns the config file the runtime options name; empty when
// they name none.
func ConfigPath(options *anypb.Any) (string, error) {
	if options == nil || !options.MessageIs(&runtimeoptions.Options{}) {
		return "", nil
	}
	var o runtimeoptions.Options
	if err := options.UnmarshalTo(&o); err != nil {
		return "", fmt.Errorf("runtime options: %w: %v", errdefs.ErrInvalidArgument, err)
	}
	if len(o.ConfigBody) > 0 {
		return "", fmt.Errorf("runtime options: %w: ConfigBody is not supported; write the configuration to a file and set ConfigPath", errdefs.ErrInvalidArgument)
	}
	if o.ConfigPath != "" && !filepath.IsAbs(o.ConfigPath) {
		return "", fmt.Errorf("runtime options: ConfigPath %q: %w: want an absolute path", o.ConfigPath, errdefs.ErrInvalidArgument)
	}
	return o.ConfigPath, nil
}

// StateDir is the state directory of sandbox id in namespace ns.
func StateDir(cfg config.Config, ns, id string) string {
	return filepath.Join(cfg.Runtime.StateDir, ns, id)
}
