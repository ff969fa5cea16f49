package containerdconfig

import (
	"bytes"
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/containerd/errdefs"
)

// Edits are made to the text, so that the rest of a file keeps its bytes,
// and each is checked on what the text means: a file decoded after the
// edit must mean what it meant before plus the one addition (or minus
// the one removal). An edit whose text would mean anything else is
// refused, whatever the file looks like.

// tomlDoc is a config file decoded, to read what it means.
type tomlDoc map[string]any

func decode(data []byte) (tomlDoc, error) {
	var m map[string]any
	if _, err := toml.Decode(string(data), &m); err != nil {
		return nil, fmt.Errorf("%w: not valid TOML: %v", errdefs.ErrInvalidArgument, err)
	}
	if m == nil {
		m = map[string]any{}
	}
	return m, nil
}

// version is the file's config version; 0 when it has none.
func (d tomlDoc) version() int {
	v, _ := d["version"].(int64)
	return int(v)
}

// imports are the file's top-level imports.
func (d tomlDoc) imports() []string {
	return stringsOf(d["imports"])
}

func stringsOf(v any) []string {
	a, _ := v.([]any)
	var out []string
	for _, e := range a {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// criDisabled returns the disabled_plugins entry that disables the CRI.
func (d tomlDoc) criDisabled() (string, bool) {
	for _, p := range stringsOf(d["disabled_plugins"]) {
		if p == "cri" || p == PluginV2 || p == PluginV3 {
			return p, true
		}
	}
	return "", false
}

// table is the table at that path of keys; nil when there is none.
func (d tomlDoc) table(keys ...string) map[string]any {
	m := map[string]any(d)
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}

func (d tomlDoc) hasHandler(plugin string) bool {
	return d.table("plugins", plugin, "containerd", "runtimes", Handler) != nil
}

// importsCover says whether the file's imports, as containerd resolves
// them (relative to the main file's directory; a path with a * a glob),
// include path.
func (d tomlDoc) importsCover(mainPath, path string) bool {
	for _, imp := range d.imports() {
		p := filepath.Clean(imp)
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(mainPath), p)
		}
		if strings.Contains(p, "*") {
			if ok, _ := filepath.Match(p, path); ok {
				return true
			}
		} else if p == path {
			return true
		}
	}
	return false
}

var (
	// tableHeader starts the first table: top-level keys come before it.
	tableHeader = regexp.MustCompile(`(?m)^[ \t]*\[`)
	// importsKey is the top-level imports array up to its opening bracket.
	importsKey = regexp.MustCompile(`(?m)^[ \t]*(?:imports|"imports"|'imports')[ \t]*=[ \t]*\[`)
	// versionLine is the line of the top-level version key.
	versionLine = regexp.MustCompile(`(?m)^[ \t]*(?:version|"version"|'version')[ \t]*=[^\n]*(?:\n|$)`)
)

// topLevel is the part of data before the first table.
func topLevel(data []byte) []byte {
	if loc := tableHeader.FindIndex(data); loc != nil {
		return data[:loc[0]]
	}
	return data
}

func insert(data []byte, at int, s string) []byte {
	out := make([]byte, 0, len(data)+len(s))
	out = append(out, data[:at]...)
	out = append(out, s...)
	return append(out, data[at:]...)
}

func quote(path string) (string, error) {
	if strings.ContainsFunc(path, func(r rune) bool { return r == '"' || r == '\\' || r < 0x20 || r == 0x7f }) {
		return "", fmt.Errorf("path %q: %w: it must not need escaping in TOML", path, errdefs.ErrInvalidArgument)
	}
	return `"` + path + `"`, nil
}

// importLine is the line addImport adds where there is no imports array.
func importLine(q string) string {
	return "imports = [" + q + "] " + importComment
}

// addImport puts path first in the top-level imports array of data (the
// file at mainPath), or, with no array, adds one on the line after the
// version key's.
func addImport(mainPath string, data []byte, doc tomlDoc, path string) ([]byte, string, error) {
	q, err := quote(path)
	if err != nil {
		return nil, "", err
	}
	top := topLevel(data)
	var cand []byte
	how := "added " + path + " to the imports of " + mainPath
	if loc := importsKey.FindIndex(top); loc != nil {
		el := q
		if len(doc.imports()) > 0 {
			el += ", "
		}
		cand = insert(data, loc[1], el)
	} else if loc := versionLine.FindIndex(top); loc != nil {
		line := importLine(q)
		if data[loc[1]-1] == '\n' {
			cand = insert(data, loc[1], line+"\n")
		} else {
			cand = insert(data, loc[1], "\n"+line)
		}
		how = "added an imports line for " + path + " to " + mainPath
	}
	if cand != nil {
		if err := checkImports(doc, cand, append([]string{path}, doc.imports()...)); err == nil {
			return cand, how, nil
		}
	}
	return nil, "", fmt.Errorf("%w: cannot add %q to the top-level imports without changing the rest; add it by hand", errdefs.ErrFailedPrecondition, path)
}

// removeImport takes path out of the top-level imports of data (the file
// at mainPath), the way addImport put it there.
func removeImport(mainPath string, data []byte, path string) ([]byte, string, error) {
	before, err := decode(data)
	if err != nil {
		return nil, "", err
	}
	imps := before.imports()
	i := slices.Index(imps, path)
	if i < 0 {
		return data, "", nil
	}
	want := slices.Delete(slices.Clone(imps), i, i+1)
	q, err := quote(path)
	if err != nil {
		return nil, "", err
	}
	var cands [][]byte
	line := importLine(q)
	if at := bytes.Index(data, []byte(line+"\n")); at >= 0 {
		cands = append(cands, slices.Concat(data[:at], data[at+len(line)+1:]))
	}
	if bytes.HasSuffix(data, []byte("\n"+line)) {
		cands = append(cands, data[:len(data)-len(line)-1])
	}
	top := topLevel(data)
	for _, el := range []string{q + ", ", ", " + q, q} {
		for off := 0; ; {
			n := bytes.Index(top[off:], []byte(el))
			if n < 0 {
				break
			}
			at := off + n
			cands = append(cands, slices.Concat(data[:at], data[at+len(el):]))
			off = at + 1
		}
	}
	for _, c := range cands {
		if checkImports(before, c, want) == nil {
			return c, "removed " + path + " from the imports of " + mainPath, nil
		}
	}
	return nil, "", fmt.Errorf("%w: cannot take %q out of the top-level imports without changing the rest; remove it by hand", errdefs.ErrFailedPrecondition, path)
}

// checkImports says whether data means what before means, with imports
// want.
func checkImports(before tomlDoc, data []byte, want []string) error {
	after, err := decode(data)
	if err != nil {
		return err
	}
	if got := after.imports(); !slices.Equal(got, want) {
		return fmt.Errorf("imports %q, want %q", got, want)
	}
	a, b := shallowCopy(before), shallowCopy(after)
	delete(a, "imports")
	delete(b, "imports")
	if !reflect.DeepEqual(a, b) {
		return fmt.Errorf("the edit changes more than the imports")
	}
	return nil
}

// checkBlockAdded says whether with means what without means plus the
// runtime tables of tables (the text of a block), as they read alone.
func checkBlockAdded(without, with []byte, tables string) error {
	a, err := decode(without)
	if err != nil {
		return err
	}
	b, err := decode(with)
	if err != nil {
		return fmt.Errorf("with the runtime %s appended: %w", Handler, err)
	}
	added, err := decode([]byte(tables))
	if err != nil {
		return err
	}
	path := []string{"plugins", PluginV2, "containerd", "runtimes"}
	runtimes := b.table(path...)
	for name, want := range added.table(path...) {
		if runtimes == nil || !reflect.DeepEqual(runtimes[name], want) {
			return fmt.Errorf("%w: the runtime %s, appended, does not read as written: the file's tables get in the way; add it by hand", errdefs.ErrFailedPrecondition, name)
		}
		delete(runtimes, name)
	}
	if !reflect.DeepEqual(prune(a), prune(b)) {
		return fmt.Errorf("%w: appending the runtime %s would change more than it: add it by hand", errdefs.ErrFailedPrecondition, Handler)
	}
	return nil
}

func shallowCopy(d tomlDoc) map[string]any {
	m := make(map[string]any, len(d))
	for k, v := range d {
		m[k] = v
	}
	return m
}

// prune drops the empty tables of m, at every depth, for comparing what
// two files mean: appending a table defines the tables above it.
func prune(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if t, ok := v.(map[string]any); ok {
			t = prune(t)
			if len(t) == 0 {
				continue
			}
			v = t
		}
		out[k] = v
	}
	return out
}
