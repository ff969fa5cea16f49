package containerdconfig

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// tomlBlocks are the ```toml blocks of a markdown file.
func tomlBlocks(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var cur *strings.Builder
	for _, line := range strings.SplitAfter(string(data), "\n") {
		switch {
		case cur == nil && strings.TrimSpace(line) == "```toml":
			cur = &strings.Builder{}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(line)
		}
	}
	return blocks
}

// TestDocSnippets: the CRI snippets of docs/containerd.md are Snippet's,
// so that the doc, `cocoon containerd-config` and the installed docs say
// the same.
func TestDocSnippets(t *testing.T) {
	blocks := tomlBlocks(t, "../../docs/containerd.md")
	for _, v := range []int{2, 3} {
		want, err := Snippet(v)
		if err != nil {
			t.Fatal(err)
		}
		var found []string
		for _, b := range blocks {
			if strings.HasPrefix(b, want[:len("version = 2")]) {
				found = append(found, b)
			}
		}
		if len(found) != 1 || found[0] != want {
			t.Errorf("docs/containerd.md has %d ```toml blocks of version %d; want one, equal to `cocoon containerd-config --version %d`:\n%s", len(found), v, v, want)
		}
	}
}

// TestSnippet: each snippet reads as the handler's table in the CRI
// plugin of its layout, with Cocoon's annotations let through.
func TestSnippet(t *testing.T) {
	for _, tc := range []struct {
		version int
		plugin  string
	}{{2, PluginV2}, {3, PluginV3}, {4, PluginV3}} {
		s, err := Snippet(tc.version)
		if err != nil {
			t.Fatal(err)
		}
		var f struct {
			Version int `toml:"version"`
			Plugins map[string]struct {
				Containerd struct {
					Runtimes map[string]Runtime `toml:"runtimes"`
				} `toml:"containerd"`
			} `toml:"plugins"`
		}
		md, err := toml.Decode(s, &f)
		if err != nil {
			t.Fatalf("version %d: %v", tc.version, err)
		}
		rt, ok := f.Plugins[tc.plugin].Containerd.Runtimes[Handler]
		if f.Version != tc.version || !ok || len(f.Plugins) != 1 || len(md.Undecoded()) != 0 {
			t.Fatalf("version %d: %+v (undecoded %v)", tc.version, f, md.Undecoded())
		}
		if rt.RuntimeType != RuntimeType || !slices.Equal(rt.PodAnnotations, []string{AnnotationPattern}) || !slices.Equal(rt.ContainerAnnotations, []string{AnnotationPattern}) || !rt.PrivilegedWithoutHostDevices || rt.Options != nil {
			t.Fatalf("version %d: runtime %+v", tc.version, rt)
		}
	}
	for _, v := range []int{0, 1, 5} {
		if _, err := Snippet(v); err == nil {
			t.Errorf("Snippet(%d) made a snippet", v)
		}
	}
}
