package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/cocoonrt/cocoon/runtime/hypervisor/qemu"
	"github.com/cocoonrt/cocoon/runtime/sandbox"
	"github.com/cocoonrt/cocoon/runtime/share"
)

// SandboxEntry is one sandbox found under the state directory.
type SandboxEntry struct {
	// Dir is the sandbox's state directory.
	Dir string
	// State is its record; zero if unreadable.
	State sandbox.State
	// StateErr says why State could not be read.
	StateErr error
	// VMMPid is the pid of its running VMM, 0 if none runs.
	VMMPid int
}

// Sandboxes lists the sandboxes under the state directory, of every
// namespace.
func (e *Env) Sandboxes() ([]SandboxEntry, error) {
	root := e.Config.Runtime.StateDir
	nss, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []SandboxEntry
	for _, ns := range nss {
		if !ns.IsDir() {
			continue
		}
		ids, err := os.ReadDir(filepath.Join(root, ns.Name()))
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			if !id.IsDir() {
				continue
			}
			dir := filepath.Join(root, ns.Name(), id.Name())
			st, err := sandbox.ReadState(dir)
			out = append(out, SandboxEntry{Dir: dir, State: st, StateErr: err, VMMPid: qemu.Running(dir)})
		}
	}
	return out, nil
}

// PS prints the sandboxes as a table.
func (e *Env) PS(w io.Writer) error {
	list, err := e.Sandboxes()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tSANDBOX\tVMM PID\tSTATUS\tCREATED")
	for _, s := range list {
		ns, id := filepath.Base(filepath.Dir(s.Dir)), filepath.Base(s.Dir)
		status, created := "running", "-"
		if s.VMMPid == 0 {
			status = "stale (no vmm)"
		}
		if s.StateErr != nil {
			status += ", no state record"
		} else {
			created = s.State.Created.Local().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", ns, id, s.VMMPid, status, created)
	}
	return tw.Flush()
}

// GC removes the state of sandboxes whose VMM no longer runs, which a
// killed owner can leave behind. Running sandboxes are never touched, nor
// are sandboxes younger than the start timeout: their VMM may be starting.
func (e *Env) GC(ctx context.Context, w io.Writer) error {
	list, err := e.Sandboxes()
	if err != nil {
		return err
	}
	var errs []error
	// The VM of a template being made belongs to the process making it;
	// one that outlived its maker (killed mid-creation) is ended.
	creating := e.Templates().Creating()
	for _, s := range list {
		switch ns := filepath.Base(filepath.Dir(s.Dir)); {
		case ns == sandbox.SpareNamespace && !sandbox.SpareHeld(e.Config.Runtime.StateDir, sandbox.SpareKeyOf(filepath.Base(s.Dir))):
			// A spare's VM whose spare process is gone (killed) is
			// ended too, whatever its age: the lock is held from before
			// the VM starts until it is stopped or handed over.
		case e.young(s):
			continue
		case s.VMMPid != 0 && (ns != sandbox.TemplateNamespace || creating):
			continue
		}
		if err := qemu.Cleanup(ctx, s.Dir); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := share.RemoveAll(s.Dir); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(w, "removed stale sandbox %s\n", s.Dir)
	}
	if err := e.gcContainerDirs(w); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// gcContainerDirs removes the persistent container directories (scratch
// disks, layer references) of sandboxes that no longer have state: a
// sandbox that crashed and was cleaned up by `shim delete` or by GC
// leaves them, and they keep their layers referenced.
func (e *Env) gcContainerDirs(w io.Writer) error {
	root := filepath.Join(e.Config.Runtime.DataDir, sandbox.ContainersDirName)
	nss, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range nss {
		ids, err := os.ReadDir(filepath.Join(root, ns.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, id := range ids {
			state := filepath.Join(e.Config.Runtime.StateDir, ns.Name(), id.Name())
			if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
				continue // the sandbox exists (or cannot be told apart): keep
			}
			dir := filepath.Join(root, ns.Name(), id.Name())
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, err)
				continue
			}
			fmt.Fprintf(w, "removed containers of gone sandbox %s\n", dir)
		}
	}
	return errors.Join(errs...)
}

// young reports whether s may still be starting.
func (e *Env) young(s SandboxEntry) bool {
	created := s.State.Created
	if s.StateErr != nil {
		fi, err := os.Stat(s.Dir)
		if err != nil {
			return false
		}
		created = fi.ModTime()
	}
	return time.Since(created) < e.Config.Runtime.StartTimeout.Duration
}
