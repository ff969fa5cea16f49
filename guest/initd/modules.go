package initd

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"strings"
)

// ModulesFile lists kernel modules to load at boot, one path per line
// relative to /lib/modules/<release>/, in load order (dependencies first).
// Blank lines and lines starting with # are skipped.
const ModulesFile = "/etc/cocoon/modules"

// maxModules bounds the list; a guest image needs a handful.
const maxModules = 1024

// ParseModules reads a modules list. Paths must stay inside the modules
// directory and name a module file (.ko, optionally compressed).
func ParseModules(r io.Reader) ([]string, error) {
	var mods []string
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		clean := path.Clean(s)
		if path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
			return nil, fmt.Errorf("%s line %d: %q must be relative to the modules directory", ModulesFile, line, s)
		}
		if !isModuleFile(clean) {
			return nil, fmt.Errorf("%s line %d: %q is not a .ko module", ModulesFile, line, s)
		}
		if len(mods) == maxModules {
			return nil, fmt.Errorf("%s: more than %d modules", ModulesFile, maxModules)
		}
		mods = append(mods, clean)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", ModulesFile, err)
	}
	return mods, nil
}

func isModuleFile(p string) bool {
	return strings.HasSuffix(p, ".ko") || compressedModule(p)
}

// compressedModule reports whether the kernel must decompress p
// (MODULE_INIT_COMPRESSED_FILE, CONFIG_MODULE_DECOMPRESS).
func compressedModule(p string) bool {
	for _, ext := range []string{".ko.xz", ".ko.zst", ".ko.gz"} {
		if strings.HasSuffix(p, ext) {
			return true
		}
	}
	return false
}
