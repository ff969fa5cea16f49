package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cocoonrt/cocoon/runtime/sandbox"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// RunSpare makes the spare of the configured shape (or of the size o
// gives; o.Key must be its key) and serves it until a sandbox claims it,
// it is stopped or ctx ends (docs/templates.md). A spare of the shape
// already there is not an error: it says so on w and returns.
func (e *Env) RunSpare(ctx context.Context, w io.Writer, o TemplateOptions) error {
	env, err := e.sized(o)
	if err != nil {
		return err
	}
	so, err := env.sandboxOptions("spare")
	if err != nil {
		return err
	}
	err = sandbox.RunSpare(ctx, so, env.Templates(), sandbox.SpareOptions{Key: o.Key, Ready: func(dir string) {
		fmt.Fprintf(w, "spare of template %s ready: %s\n", o.Key, dir)
	}})
	if errors.Is(err, sandbox.ErrSpareRunning) {
		fmt.Fprintf(w, "a spare of template %s is already there\n", o.Key)
		return nil
	}
	return err
}

// stopSpare stops the spare of key if one runs, and says so on w.
func (e *Env) stopSpare(ctx context.Context, w io.Writer, key string) error {
	stopped, err := sandbox.StopSpare(ctx, e.Config.Runtime.StateDir, key)
	if stopped {
		fmt.Fprintf(w, "stopped the spare of template %s\n", key)
	}
	return err
}

// gcSpares stops the spares of templates that are no longer in the store
// (removed, or found stale by GCTemplates), and removes the locks and
// sockets of spares that are gone.
func (e *Env) gcSpares(ctx context.Context, w io.Writer) error {
	dir := filepath.Join(e.Config.Runtime.StateDir, sandbox.SpareNamespace)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, en := range ents {
		key, ok := strings.CutSuffix(en.Name(), ".lock")
		if !ok || template.ValidKey(key) != nil {
			continue
		}
		if !sandbox.SpareHeld(e.Config.Runtime.StateDir, key) {
			lock, sock := sandbox.SparePaths(e.Config.Runtime.StateDir, key)
			_ = os.Remove(sock)
			_ = os.Remove(lock)
			continue
		}
		if _, err := os.Lstat(filepath.Join(e.Templates().Dir(), key)); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := e.stopSpare(ctx, w, key); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
