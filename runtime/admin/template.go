package admin

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu"
	"github.com/cocoonrt/cocoon/runtime/image"
	"github.com/cocoonrt/cocoon/runtime/sandbox"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// TemplateOptions say which template CreateTemplate makes.
type TemplateOptions struct {
	// VCPUs and MemoryMiB, if set, size the VM instead of the
	// configuration (as the io.cocoon.vcpus and io.cocoon.memory_mib
	// annotations do).
	VCPUs, MemoryMiB int
	// Key, if set, is the key the shape must have: a background creation
	// asked for one shape must not make another.
	Key string
	// Replace makes a new template even if a valid one exists.
	Replace bool
	// Automatic is a background creation: it gives way to a creation
	// already running and records its failure (template.CreateOptions).
	Automatic bool
}

// Templates is the store of templates.
func (e *Env) Templates() *template.Store { return template.Open(e.Config.Runtime.DataDir) }

// DefaultOptions are the options of a sandbox of the configured shape,
// as ShapeOf takes them.
func (e *Env) DefaultOptions() (sandbox.Options, error) { return e.sandboxOptions("shape") }

// sandboxOptions are the options of a sandbox of the cocoon namespace
// named id.
func (e *Env) sandboxOptions(id string) (sandbox.Options, error) {
	img, err := image.Open(e.Config.Guest.ImageDir)
	if err != nil {
		return sandbox.Options{}, err
	}
	return sandbox.Options{
		Namespace:   Namespace,
		ID:          id,
		Config:      e.Config,
		Driver:      qemu.New(qemu.Config{Binary: e.Config.Hypervisor.Path}),
		Image:       img,
		AccelHost:   e.AccelHost,
		ChannelHost: e.ChannelHost,
	}, nil
}

// CreateTemplate makes the template of the configured shape (or of the
// size o gives) and says on w what it did.
func (e *Env) CreateTemplate(ctx context.Context, w io.Writer, o TemplateOptions) error {
	cfg := e.Config
	if o.VCPUs > 0 {
		cfg.Hypervisor.VCPUs = o.VCPUs
	}
	if o.MemoryMiB > 0 {
		cfg.Hypervisor.MemoryMiB = o.MemoryMiB
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	env := *e
	env.Config = cfg
	so, err := env.sandboxOptions("template")
	if err != nil {
		return err
	}
	shape, err := sandbox.ShapeOf(so)
	if err != nil {
		return err
	}
	if o.Key != "" && shape.Key() != o.Key {
		return fmt.Errorf("the shape asked for has key %s, this configuration's is %s: the configuration changed: %w", o.Key, shape.Key(), errdefs.ErrFailedPrecondition)
	}
	began := time.Now()
	t, created, err := sandbox.MakeTemplate(ctx, so, env.Templates(), template.CreateOptions{NoWait: o.Automatic, Automatic: o.Automatic, Replace: o.Replace})
	if err != nil {
		return err
	}
	if !created {
		fmt.Fprintf(w, "template %s exists: %s\n", t.Key(), t.Dir)
		return nil
	}
	m := t.Manifest
	fmt.Fprintf(w, "template %s created in %v (guest ready in %d ms, saved in %d ms): %s\n",
		t.Key(), time.Since(began).Round(time.Millisecond), m.BootMillis, m.SaveMillis, t.Dir)
	return nil
}
