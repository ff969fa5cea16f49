// Package admin implements the cocoon command's verbs (check, run, ps, gc)
// so that cmd/cocoon only parses flags and tests can call them directly.
package admin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/sandbox"
)

// Namespace holds the sandboxes that the cocoon command starts itself
// (check, run), apart from containerd's namespaces.
const Namespace = "cocoon"

// Env is what every verb works with: the validated configuration and the
// facts of the host.
type Env struct {
	// Config is validated.
	Config config.Config
	// ConfigSource says where the configuration came from, for check.
	ConfigSource string
	// AccelHost and ChannelHost are the host facts selection uses.
	AccelHost   hypervisor.AccelHost
	ChannelHost channel.Host
	// ContainerdConfig is the containerd config file whose CRI handler
	// check reports; empty: containerd's default.
	ContainerdConfig string
}

// LoadEnv loads the configuration from path (empty: the default places)
// and the environment, and reads the host's facts.
func LoadEnv(path string) (*Env, error) {
	cfg, err := config.Load(path, os.Getenv)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	src := path
	if src == "" {
		src = os.Getenv("COCOON_CONFIG")
	}
	if src == "" {
		src = config.DefaultPath
		if _, err := os.Stat(src); err != nil {
			src += " (absent: compiled-in defaults)"
		}
	}
	return &Env{Config: cfg, ConfigSource: src, AccelHost: hypervisor.LocalAccelHost(), ChannelHost: channel.LocalHost()}, nil
}

// StartSandbox boots a sandbox of the cocoon namespace with a fresh id
// made of prefix and random hex; it never starts from a template (check
// and bench boot).
func (e *Env) StartSandbox(ctx context.Context, prefix string) (*sandbox.Sandbox, error) {
	o, err := e.newSandbox(prefix)
	if err != nil {
		return nil, err
	}
	return sandbox.Start(ctx, o)
}

// StartSandboxWithTemplate starts a sandbox as StartSandbox does, from the
// template of its shape as template.mode says (sandbox.StartWithTemplate).
func (e *Env) StartSandboxWithTemplate(ctx context.Context, prefix string) (*sandbox.Sandbox, sandbox.TemplateUse, error) {
	o, err := e.newSandbox(prefix)
	if err != nil {
		return nil, sandbox.TemplateUse{}, err
	}
	return sandbox.StartWithTemplate(ctx, o, e.Templates())
}

// newSandbox are the options of a new sandbox named prefix-<random hex>.
func (e *Env) newSandbox(prefix string) (sandbox.Options, error) {
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return sandbox.Options{}, err
	}
	return e.sandboxOptions(prefix + "-" + hex.EncodeToString(rnd[:]))
}
