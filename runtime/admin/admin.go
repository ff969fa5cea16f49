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
	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu"
	"github.com/cocoonrt/cocoon/runtime/image"
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
// made of prefix and random hex.
func (e *Env) StartSandbox(ctx context.Context, prefix string) (*sandbox.Sandbox, error) {
	img, err := image.Open(e.Config.Guest.ImageDir)
	if err != nil {
		return nil, err
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	return sandbox.Start(ctx, sandbox.Options{
		Namespace:   Namespace,
		ID:          prefix + "-" + hex.EncodeToString(rnd[:]),
		Config:      e.Config,
		Driver:      qemu.New(qemu.Config{Binary: e.Config.Hypervisor.Path}),
		Image:       img,
		AccelHost:   e.AccelHost,
		ChannelHost: e.ChannelHost,
	})
}
