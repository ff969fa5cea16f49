package containerdconfig

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
)

// How Install changes containerd's configuration depends on the layout,
// because containerd merges an imported file differently by version:
//
//   - containerd 2.x (LayoutV3) merges an imported file's plugin tables key
//     by key into the main file's. Install writes the handler's table to a
//     drop-in, conf.d/cocoon.toml next to the main file, and adds that path
//     to the main file's top-level imports array (one element, or one line
//     where there is no array; nothing when an import such as 2.4's default
//     conf.d/*.toml already covers it).
//   - containerd 1.6 and 1.7 (LayoutV2) replace a plugin's whole table with
//     the imported file's (services/server/config's mergeConfig): a drop-in
//     holding the CRI runtime table would reset every other CRI setting of
//     the main file to containerd's defaults. Install appends the table to
//     the end of the main file instead, between two marker comments. 1.x
//     also decodes a file's runtimes over its default ones, the map
//     whole: a file that defines no runtime loses runc once it defines
//     the handler, so the block then defines runc too, as the defaults do.
//
// Either way no byte of the file is changed, only bytes added, and
// Uninstall removes exactly those: the main file gets its bytes back. A
// missing main file is created (containerd's defaults, plus the handler),
// and Uninstall removes it again.

// Markers of what Install adds. Uninstall finds its additions by them.
const (
	blockBegin    = "# cocoon: begin. `cocoon deploy install` added the CRI runtime cocoon; `cocoon deploy uninstall` removes it."
	blockEnd      = "# cocoon: end"
	importComment = "# added by `cocoon deploy install`; `cocoon deploy uninstall` removes it"
	dropInHeader  = "# Cocoon's CRI runtime handler, written by `cocoon deploy install`; `cocoon deploy uninstall` removes this file.\n"
	createdHeader = "# containerd's defaults and Cocoon's CRI runtime: `cocoon deploy install` made\n# this file where there was none, and `cocoon deploy uninstall` removes it.\n"
)

// inlineParent is a key that may define a table above the handler's as
// an inline table, which containerd's TOML parsers refuse to add a table
// to (BurntSushi's, which checks the edit, would let it be added).
var inlineParent = regexp.MustCompile(`(?m)(?:^|[.\s])(?:plugins|"io\.containerd\.grpc\.v1\.cri"|'io\.containerd\.grpc\.v1\.cri'|containerd|runtimes)[ \t]*=[ \t]*\{`)

// DefaultPath is where containerd reads its configuration.
const DefaultPath = "/etc/containerd/config.toml"

// File is a file's content, or its absence.
type File struct {
	// Exists is false for a file that is not there.
	Exists bool
	// Data is the file's content.
	Data []byte
}

func (f File) equal(g File) bool {
	return f.Exists == g.Exists && bytes.Equal(f.Data, g.Data)
}

// Files are containerd's main config file and Cocoon's drop-in beside it.
type Files struct {
	// Path is the main config file, as containerd names it.
	Path string
	// Main is the main config file.
	Main File
	// DropIn is the file at DropInPath(Path).
	DropIn File
}

// Equal says whether f and g hold the same contents.
func (f Files) Equal(g Files) bool {
	return f.Path == g.Path && f.Main.equal(g.Main) && f.DropIn.equal(g.DropIn)
}

// DropInPath is where Install writes the handler's table for containerd
// 2.x: conf.d/cocoon.toml in the main file's directory.
func DropInPath(mainPath string) string {
	return filepath.Join(filepath.Dir(mainPath), "conf.d", Handler+".toml")
}

// dropIn is the drop-in's content.
func dropIn() []byte {
	s, _ := Snippet(LayoutV3.Version())
	return []byte(dropInHeader + s)
}

// defaultRuntimeV2 is containerd 1.x's default runtime, runc, as its
// defaults have it (pkg/cri/config's DefaultConfig: runc.v2, options all
// zero, 1.7's sandbox_mode podsandbox when empty).
const defaultRuntimeV2 = `# containerd 1.6 and 1.7 drop their default runtime, runc, once the
# configuration defines any runtime: it is here as their defaults have it.
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
`

// blockTables is what Install adds to a version 2 main file: the
// handler's table, and runc's when the file defines no runtime, which
// containerd 1.x would then drop (it decodes the file's runtimes over
// its default ones, the map whole).
func blockTables(doc tomlDoc) string {
	if len(doc.table("plugins", PluginV2, "containerd", "runtimes")) == 0 {
		return Tables(LayoutV2) + defaultRuntimeV2
	}
	return Tables(LayoutV2)
}

// block is the text Install appends with tables.
func block(tables string) string {
	return "\n" + blockBegin + "\n" + tables + blockEnd + "\n"
}

// Install returns f with Cocoon's handler added, and a sentence saying
// what changed ("" when nothing: f had it). containerdMajor (0: not
// known) picks the layout of a main file that does not exist, and must
// be able to read one that does. A handler that f's main file defines
// itself is left as it is, and said so. Install refuses a main file it
// cannot add to without changing what the rest of it means.
func Install(f Files, containerdMajor int) (Files, string, error) {
	out := f
	var notes []string
	if !f.Main.Exists {
		l, err := LayoutForContainerd(containerdMajor)
		if err != nil {
			return f, "", fmt.Errorf("%s does not exist and containerd's version is not known: %w", f.Path, err)
		}
		out.Main = File{Exists: true, Data: []byte(fmt.Sprintf("%sversion = %d\n", createdHeader, l.Version()))}
		notes = append(notes, "created "+f.Path+" (containerd's defaults)")
	}
	doc, err := decode(out.Main.Data)
	if err != nil {
		return f, "", fmt.Errorf("%s: %w", f.Path, err)
	}
	l, err := LayoutOf(doc.version())
	if err != nil {
		return f, "", fmt.Errorf("%s: %w", f.Path, err)
	}
	if l == LayoutV3 && containerdMajor == 1 {
		return f, "", fmt.Errorf("%s is config version %d, which containerd 1.x does not read: %w", f.Path, doc.version(), errdefs.ErrFailedPrecondition)
	}
	if p, ok := doc.criDisabled(); ok {
		return f, "", fmt.Errorf("%s disables the CRI plugin (disabled_plugins has %q): Kubernetes cannot use containerd here: %w", f.Path, p, errdefs.ErrFailedPrecondition)
	}
	if l == LayoutV2 {
		return installBlock(f, out, notes)
	}
	return installDropIn(f, out, doc, notes)
}

// handMade is Install's note on a handler the main file defines itself.
func handMade(path string) string {
	return fmt.Sprintf("%s defines the runtime %s itself: left as it is (remove it there to let cocoon deploy manage it)", path, Handler)
}

func installBlock(f, out Files, notes []string) (Files, string, error) {
	main, at, had, err := withoutBlock(out.Main.Data)
	if err != nil {
		return f, "", fmt.Errorf("%s: %w", f.Path, err)
	}
	doc, err := decode(main)
	if err != nil {
		return f, "", fmt.Errorf("%s: %w", f.Path, err)
	}
	if doc.hasHandler(PluginV2) {
		return f, handMade(f.Path), nil
	}
	if loc := inlineParent.FindIndex(main); loc != nil {
		return f, "", fmt.Errorf("%s: %w: %q may define a table above the runtime %s inline, which a table cannot be added to: add it by hand", f.Path, errdefs.ErrFailedPrecondition, bytes.TrimSpace(main[loc[0]:loc[1]]), Handler)
	}
	tables := blockTables(doc)
	want := insert(main, at, block(tables))
	if err := checkBlockAdded(main, want, tables); err != nil {
		return f, "", fmt.Errorf("%s: %w", f.Path, err)
	}
	out.Main.Data = want
	switch {
	case out.Equal(f):
		return f, "", nil
	case had:
		notes = append(notes, "updated the runtime "+Handler+" in "+f.Path)
	default:
		notes = append(notes, "appended the runtime "+Handler+" to "+f.Path)
	}
	return out, strings.Join(notes, ", "), nil
}

func installDropIn(f, out Files, doc tomlDoc, notes []string) (Files, string, error) {
	dropInPath := DropInPath(f.Path)
	if doc.hasHandler(PluginV3) || doc.hasHandler(PluginV2) {
		return f, handMade(f.Path), nil
	}
	if f.DropIn.Exists && !bytes.HasPrefix(f.DropIn.Data, []byte(dropInHeader)) {
		return f, "", fmt.Errorf("%s exists and is not cocoon deploy's: %w", dropInPath, errdefs.ErrAlreadyExists)
	}
	out.DropIn = File{Exists: true, Data: dropIn()}
	if !out.DropIn.equal(f.DropIn) {
		notes = append(notes, "wrote "+dropInPath)
	}
	if !doc.importsCover(f.Path, dropInPath) {
		main, how, err := addImport(f.Path, out.Main.Data, doc, dropInPath)
		if err != nil {
			return f, "", fmt.Errorf("%s: %w", f.Path, err)
		}
		out.Main.Data = main
		notes = append(notes, how)
	}
	if out.Equal(f) {
		return f, "", nil
	}
	return out, strings.Join(notes, ", "), nil
}

// Uninstall returns f without what Install added, and a sentence saying
// what it removed ("" when nothing). It removes Cocoon's traces whatever
// the file's version now is, and nothing else.
func Uninstall(f Files) (Files, string, error) {
	out := f
	var notes []string
	if f.Main.Exists {
		main, _, had, err := withoutBlock(f.Main.Data)
		if err != nil {
			return f, "", fmt.Errorf("%s: %w", f.Path, err)
		}
		if had {
			if _, err := decode(main); err != nil {
				return f, "", fmt.Errorf("%s without the runtime %s: %w", f.Path, Handler, err)
			}
			notes = append(notes, "removed the runtime "+Handler+" from "+f.Path)
		}
		main, how, err := removeImport(f.Path, main, DropInPath(f.Path))
		if err != nil {
			return f, "", fmt.Errorf("%s: %w", f.Path, err)
		}
		if how != "" {
			notes = append(notes, how)
		}
		out.Main.Data = main
		if isCreated(main) {
			out.Main = File{}
			notes = append(notes, "removed "+f.Path+", which cocoon deploy install had made")
		}
	}
	if f.DropIn.Exists && bytes.HasPrefix(f.DropIn.Data, []byte(dropInHeader)) {
		out.DropIn = File{}
		notes = append(notes, "removed "+DropInPath(f.Path))
	}
	if out.Equal(f) {
		return f, "", nil
	}
	return out, strings.Join(notes, ", "), nil
}

// isCreated says whether data is a main file Install made and nothing
// else.
func isCreated(data []byte) bool {
	for _, l := range []Layout{LayoutV2, LayoutV3} {
		if string(data) == fmt.Sprintf("%sversion = %d\n", createdHeader, l.Version()) {
			return true
		}
	}
	return false
}

// withoutBlock returns data without the block Install added, where the
// block was (the end of data when there was none), and whether there
// was one.
func withoutBlock(data []byte) (_ []byte, at int, had bool, _ error) {
	begin := bytes.Index(data, []byte("\n"+blockBegin+"\n"))
	if begin < 0 {
		if bytes.HasPrefix(data, []byte(blockBegin+"\n")) {
			return nil, 0, false, fmt.Errorf("%w: the marker %q starts the file: remove the block by hand", errdefs.ErrFailedPrecondition, blockBegin)
		}
		return data, len(data), false, nil
	}
	rest := data[begin+1:]
	end := bytes.Index(rest, []byte("\n"+blockEnd+"\n"))
	n := len(blockEnd) + 2
	if end < 0 && bytes.HasSuffix(rest, []byte("\n"+blockEnd)) {
		end, n = len(rest)-len(blockEnd)-1, len(blockEnd)+1
	}
	if end < 0 {
		return nil, 0, false, fmt.Errorf("%w: %q without %q after it: remove the block by hand", errdefs.ErrFailedPrecondition, blockBegin, blockEnd)
	}
	stop := begin + 1 + end + n
	return slices.Concat(data[:begin], data[stop:]), begin, true, nil
}
