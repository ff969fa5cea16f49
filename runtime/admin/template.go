package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/checkpoint"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
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
		Driver:      qemu.New(qemu.Config{Binary: e.Config.Hypervisor.Path, Virtiofsd: e.Config.Hypervisor.Virtiofsd}),
		Image:       img,
		AccelHost:   e.AccelHost,
		ChannelHost: e.ChannelHost,
	}, nil
}

// CreateTemplate makes the template of the configured shape (or of the
// size o gives) and says on w what it did.
func (e *Env) CreateTemplate(ctx context.Context, w io.Writer, o TemplateOptions) error {
	env, err := e.sized(o)
	if err != nil {
		return err
	}
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

// sized is e with the VM size of o, if it gives one.
func (e *Env) sized(o TemplateOptions) (*Env, error) {
	cfg := e.Config
	if o.VCPUs > 0 {
		cfg.Hypervisor.VCPUs = o.VCPUs
	}
	if o.MemoryMiB > 0 {
		cfg.Hypervisor.MemoryMiB = o.MemoryMiB
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	env := *e
	env.Config = cfg
	return &env, nil
}

// CurrentShape is the shape of a sandbox of the configuration's size:
// the shape whose template sandboxes start from unless annotations size
// them otherwise.
func (e *Env) CurrentShape() (template.Shape, error) {
	o, err := e.DefaultOptions()
	if err != nil {
		return template.Shape{}, err
	}
	return sandbox.ShapeOf(o)
}

// ListTemplates prints the store's templates as a table, with the
// records of failed creations, and marks with * the template of the
// current configuration's shape. Files are checked by their status, not
// hashed (InspectTemplate with verify hashes them).
func (e *Env) ListTemplates(w io.Writer) error {
	store := e.Templates()
	list, err := store.List()
	if err != nil {
		return err
	}
	failures, err := store.Failures()
	if err != nil {
		return err
	}
	failed := map[string]template.Failure{}
	for _, f := range failures {
		failed[f.Key] = f.Failure
	}
	cur, curErr := e.CurrentShape()
	curKey := ""
	if curErr == nil {
		curKey = cur.Key()
	}
	mark := func(key string) string {
		if key == curKey {
			return "*"
		}
		return ""
	}

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\tKEY\tVCPUS\tMEMORY\tACCEL\tCHANNEL\tGUEST\tCREATED\tDISK\tSTATUS")
	found := false
	for _, en := range list {
		found = found || en.Key == curKey
		status := templateStatus(en)
		if f, ok := failed[en.Key]; ok {
			status += "; " + failureNote(f, 160)
			delete(failed, en.Key)
		}
		if en.Template == nil {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t%s\t%s\n", mark(en.Key), en.Key, humanBytes(en.DiskBytes), status)
			continue
		}
		if sandbox.SpareHeld(e.Config.Runtime.StateDir, en.Key) {
			status += "; a spare waits"
		}
		m := en.Template.Manifest
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", mark(en.Key), en.Key, shapeColumns(m.Shape),
			m.Created.Local().Format(time.RFC3339), humanBytes(en.DiskBytes), status)
	}
	// Failed creations of keys that have no template.
	for _, f := range failures {
		if _, ok := failed[f.Key]; !ok {
			continue
		}
		size := "-\t-\t-\t-\t-"
		if f.Key == curKey {
			size = shapeColumns(cur)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t%s\n", mark(f.Key), f.Key, size, failureNote(f.Failure, 160))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case curErr != nil:
		fmt.Fprintf(w, "the current configuration's shape is unknown: %s\n", oneLine(curErr.Error(), 200))
	case found:
		fmt.Fprintf(w, "* the template of the current configuration's shape\n")
	default:
		fmt.Fprintf(w, "the current configuration's shape (key %s) has no template: `cocoon template create` makes it\n", curKey)
	}
	if e.Config.Template.Mode == config.TemplateNever {
		fmt.Fprintf(w, "template.mode is never: sandboxes boot, whatever templates there are\n")
	} else if !e.Config.Template.Spare {
		fmt.Fprintf(w, "template.spare is off: no spare is made\n")
	}
	return nil
}

// shapeColumns are the VCPUS, MEMORY, ACCEL, CHANNEL and GUEST columns
// of ListTemplates.
func shapeColumns(s template.Shape) string {
	return fmt.Sprintf("%d\t%d MiB\t%s\t%s\t%s", s.VCPUs, s.MemoryMiB, checkpoint.Show(s.Accel), checkpoint.Show(s.Channel), checkpoint.Show(s.Guest.Version))
}

// templateStatus is the STATUS of a template in ListTemplates.
func templateStatus(en template.Entry) string {
	if en.Template == nil {
		return "unreadable: " + staleReason(en.Err.Error(), en.Dir, 160)
	}
	ok, err := en.Template.Stamped()
	switch {
	case err != nil:
		return "unreadable: " + staleReason(err.Error(), en.Dir, 160)
	case !ok:
		return "ok, files changed since last verified"
	}
	return "ok"
}

// failureNote says when and why a creation failed, on one line of at
// most about limit characters.
func failureNote(f template.Failure, limit int) string {
	when := "an unknown time"
	if !f.Time.IsZero() {
		when = f.Time.Local().Format(time.RFC3339)
	}
	return fmt.Sprintf("failed creation at %s: %s", when, oneLine(f.Error, limit))
}

// staleReason is why the template in dir is refused, without what every
// such error says: the directory and that the template is stale.
func staleReason(reason, dir string, limit int) string {
	reason = strings.TrimPrefix(reason, "template "+dir+": ")
	reason = strings.TrimSuffix(reason, ": "+template.ErrStale.Error())
	return oneLine(reason, limit)
}

// oneLine is s on one line of at most limit characters, its spaces and
// newlines folded and anything unprintable replaced, so that an error
// (a guest console's tail, say) cannot break a table or drive the
// terminal.
func oneLine(s string, limit int) string {
	s = strings.Join(strings.Fields(s), " ")
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
	if r := []rune(s); len(r) > limit {
		s = string(r[:limit-1]) + "…"
	}
	return s
}

// RemoveTemplates removes the templates of keys, and the records of
// their failed creations; with all, every template and record. It says
// on w what it removed. Keys are all checked before anything is removed;
// a key with nothing to remove does not stop the others.
func (e *Env) RemoveTemplates(w io.Writer, keys []string, all bool) error {
	store := e.Templates()
	if all {
		if len(keys) > 0 {
			return fmt.Errorf("template rm: keys and --all: %w", errdefs.ErrInvalidArgument)
		}
		var err error
		if keys, err = storeKeys(store); err != nil {
			return err
		}
		if len(keys) == 0 {
			fmt.Fprintf(w, "no templates in %s\n", store.Dir())
			return nil
		}
	}
	if len(keys) == 0 {
		return fmt.Errorf("template rm: no key given: %w", errdefs.ErrInvalidArgument)
	}
	for _, key := range keys {
		if err := template.ValidKey(key); err != nil {
			return err
		}
	}
	var errs []error
	for _, key := range keys {
		// Its spare first: it would end itself within a minute anyway.
		if err := e.stopSpare(context.Background(), w, key); err != nil {
			errs = append(errs, err)
		}
		_, statErr := os.Lstat(filepath.Join(store.Dir(), key))
		if err := store.Remove(key); err != nil {
			errs = append(errs, err)
			continue
		}
		if errors.Is(statErr, os.ErrNotExist) {
			fmt.Fprintf(w, "removed the record of a failed creation of template %s\n", key)
		} else {
			fmt.Fprintf(w, "removed template %s\n", key)
		}
	}
	return errors.Join(errs...)
}

// storeKeys are the keys of the store's templates and failure records.
func storeKeys(store *template.Store) ([]string, error) {
	list, err := store.List()
	if err != nil {
		return nil, err
	}
	failures, err := store.Failures()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var keys []string
	for _, en := range list {
		seen[en.Key] = true
		keys = append(keys, en.Key)
	}
	for _, f := range failures {
		if !seen[f.Key] {
			keys = append(keys, f.Key)
		}
	}
	sort.Strings(keys)
	return keys, nil
}

// InspectOptions say what InspectTemplate prints.
type InspectOptions struct {
	// JSON prints the manifest as JSON instead of a summary.
	JSON bool
	// Verify hashes the template's files and checks them against the
	// manifest; its failure is InspectTemplate's error.
	Verify bool
}

// InspectTemplate prints the template key: a summary (shape, machine,
// files with sizes and digests, times) or its manifest as JSON. A key
// with no template but the record of a failed creation has that printed
// (not with JSON) and is errdefs.ErrNotFound.
func (e *Env) InspectTemplate(w io.Writer, key string, o InspectOptions) error {
	if err := template.ValidKey(key); err != nil {
		return err
	}
	store := e.Templates()
	failure := store.Failure(key)
	t, err := store.Load(key)
	if err != nil {
		if failure != nil && !o.JSON {
			fmt.Fprintln(w, failureNote(*failure, 1<<16))
		}
		return err
	}
	if o.JSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(t.Manifest); err != nil {
			return err
		}
		if o.Verify {
			return t.Verify(true)
		}
		return nil
	}
	if err := e.describeTemplate(w, t); err != nil {
		return err
	}
	if failure != nil {
		fmt.Fprintln(w, failureNote(*failure, 1<<16))
	}
	if o.Verify {
		if err := t.Verify(true); err != nil {
			fmt.Fprintf(w, "verified: failed: %s\n", staleReason(err.Error(), t.Dir, 1<<16))
			return err
		}
		_, err := fmt.Fprintln(w, "verified: ok (sizes and sha256 digests)")
		return err
	}
	ok, err := t.Stamped()
	switch {
	case err != nil:
		fmt.Fprintf(w, "verified: failed: %s\n", staleReason(err.Error(), t.Dir, 1<<16))
		return err
	case ok:
		_, err = fmt.Fprintln(w, "verified: files unchanged since their digests were checked (--verify checks them again)")
	default:
		_, err = fmt.Fprintln(w, "verified: files changed since their digests were checked (--verify checks them)")
	}
	return err
}

// describeTemplate writes the summary of InspectTemplate.
func (e *Env) describeTemplate(w io.Writer, t *template.Template) error {
	m := t.Manifest
	sh, mc := m.Shape, m.Machine
	current := "no"
	if cur, err := e.CurrentShape(); err != nil {
		current = "unknown: " + oneLine(err.Error(), 200)
	} else if cur.Key() == m.Key {
		current = "yes: sandboxes of the configured size start from it"
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "key:\t%s\n", m.Key)
	fmt.Fprintf(tw, "directory:\t%s\n", t.Dir)
	fmt.Fprintf(tw, "format:\t%d\n", m.Format)
	fmt.Fprintf(tw, "created:\t%s\n", m.Created.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "current:\t%s\n", current)
	fmt.Fprintf(tw, "guest ready in:\t%d ms (boot of the template's guest)\n", m.BootMillis)
	fmt.Fprintf(tw, "saved in:\t%d ms\n", m.SaveMillis)
	fmt.Fprintf(tw, "machine:\t%s %s, %s, %d vCPUs, %d MiB, accel %s, channel %s\n",
		checkpoint.Show(mc.Driver), checkpoint.Show(mc.DriverVersion), checkpoint.Show(mc.MachineType), mc.VCPUs, mc.MemoryMiB, checkpoint.Show(mc.Accel), checkpoint.Show(mc.Channel))
	fmt.Fprintf(tw, "kernel cmdline:\t%s\n", checkpoint.ShowList(mc.KernelArgs))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "shape:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  driver:\t%s\n", checkpoint.Show(sh.Driver))
	fmt.Fprintf(tw, "  vmm:\t%s (%s)\n", checkpoint.Show(sh.VMM), checkpoint.Show(sh.VMMID))
	fmt.Fprintf(tw, "  machine type:\t%s\n", checkpoint.Show(sh.MachineType))
	fmt.Fprintf(tw, "  devices:\t%s\n", checkpoint.ShowList(sh.Devices))
	fmt.Fprintf(tw, "  vcpus:\t%d\n", sh.VCPUs)
	fmt.Fprintf(tw, "  memory:\t%d MiB\n", sh.MemoryMiB)
	fmt.Fprintf(tw, "  accel:\t%s\n", checkpoint.Show(sh.Accel))
	fmt.Fprintf(tw, "  channel:\t%s\n", checkpoint.Show(sh.Channel))
	fmt.Fprintf(tw, "  kernel args:\t%s\n", checkpoint.ShowList(sh.KernelArgs))
	fmt.Fprintf(tw, "  guest image:\t%s, kernel %s, initrd %s\n", checkpoint.Show(sh.Guest.Version), checkpoint.Show(sh.Guest.Kernel), checkpoint.Show(sh.Guest.Initrd))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "files: %d\n", len(m.Files))
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	var total, onDisk int64
	for _, f := range m.Files {
		alloc := allocatedBytes(filepath.Join(t.Dir, f.Name))
		total, onDisk = total+f.Size, onDisk+alloc
		fmt.Fprintf(tw, "  %s\t%s\t%s on disk\tsha256 %s\n", checkpoint.Show(f.Name), sizeOf(f.Size), humanBytes(alloc), checkpoint.Show(f.SHA256))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "total: %s, %s on disk\n", sizeOf(total), humanBytes(onDisk))
	return err
}

// sizeOf shows n bytes, and in a binary unit when that is not bytes.
func sizeOf(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%d bytes (%s)", n, humanBytes(n))
}

// allocatedBytes is what the file at path takes on disk (its memory
// file is sparse), 0 if it cannot be told.
func allocatedBytes(path string) int64 {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return 0
}

// treeBytes is what the files under path (or the file path) take on disk.
func treeBytes(path string) int64 {
	var n int64
	filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n += allocatedBytes(p)
		}
		return nil
	})
	return n
}

// GCTemplates removes the templates that can never be used again (see
// template.Store.GC): those that do not hold together, those of another
// guest image or VMM binary than the installed ones, the records of
// failed creations and the leftovers of interrupted ones. It says on w
// what it removed and why. With no installed guest image to tell the
// templates of the current one, it removes nothing.
func (e *Env) GCTemplates(ctx context.Context, w io.Writer) error {
	store := e.Templates()
	dir := store.Dir()
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(w, "templates %s: none\n", dir)
		return nil
	}
	img, err := image.Open(e.Config.Guest.ImageDir)
	if err != nil {
		fmt.Fprintf(w, "templates %s: kept, none removed: no guest image to tell the usable ones (%s)\n", dir, oneLine(err.Error(), 200))
		return nil
	}
	cur := template.Current{Guest: sandbox.GuestImageOf(img)}
	// Plan needs no more of a spec for the VMM binary it names.
	if p, err := qemu.New(qemu.Config{Binary: e.Config.Hypervisor.Path}).Plan(hypervisor.Spec{}); err != nil {
		fmt.Fprintf(w, "templates %s: the VMM is unknown, templates of every VMM are kept (%s)\n", dir, oneLine(err.Error(), 200))
	} else {
		cur.VMM, cur.VMMID = p.VMM, p.VMMID
	}
	// What each entry takes, before GC removes it.
	sizes := map[string]int64{}
	if ents, err := os.ReadDir(dir); err == nil {
		for _, en := range ents {
			sizes[en.Name()] = treeBytes(filepath.Join(dir, en.Name()))
		}
	}
	removed, err := store.GC(ctx, cur)
	var freed int64
	for _, r := range removed {
		freed += sizes[r.Name]
		if template.ValidKey(r.Name) == nil {
			fmt.Fprintf(w, "removed template %s (%s)\n", r.Name, staleReason(r.Reason, filepath.Join(dir, r.Name), 1<<16))
		} else {
			fmt.Fprintf(w, "removed %s (%s)\n", filepath.Join(dir, r.Name), r.Reason)
		}
	}
	fmt.Fprintf(w, "templates %s: removed %d, freed %s\n", dir, len(removed), humanBytes(freed))
	if err != nil {
		err = fmt.Errorf("templates gc: %w", err)
	}
	return errors.Join(err, e.gcSpares(ctx, w))
}
