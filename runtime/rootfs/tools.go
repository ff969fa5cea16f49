package rootfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
)

// tool is an external program Prepare runs.
type tool struct {
	// name is the executable's name.
	name string
	// pkg is the Debian package that ships it, for error messages.
	pkg string
}

var (
	toolMkfsErofs = tool{name: "mkfs.erofs", pkg: "erofs-utils"}
	toolMkfsExt4  = tool{name: "mkfs.ext4", pkg: "e2fsprogs"}
	toolCp        = tool{name: "cp", pkg: "coreutils"}
)

// toolDirs are searched after PATH: containerd may start shims with a PATH
// that lacks the sbin directories.
var toolDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// toolEnv is the environment of the tools: no configuration from the
// caller's environment (MKE2FS_CONFIG, ...), untranslated messages.
var toolEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}

// find returns the tool's path, or an error wrapping errdefs.ErrNotFound
// that names the package to install.
func (t tool) find() (string, error) {
	if p, err := exec.LookPath(t.name); err == nil {
		return p, nil
	}
	for _, d := range toolDirs {
		p := filepath.Join(d, t.name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %s is not installed (Debian package %s)", errdefs.ErrNotFound, t.name, t.pkg)
}

// CheckTools reports whether the programs Prepare runs (mkfs.erofs,
// mkfs.ext4, cp) are installed, naming the packages of those missing.
func CheckTools() error {
	var errs []error
	for _, t := range []tool{toolMkfsErofs, toolMkfsExt4, toolCp} {
		if _, err := t.find(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// maxToolOutput bounds how much of a tool's output is kept for an error
// message.
const maxToolOutput = 4 << 10

// run runs tool t with args, bounded by ctx. Its output is discarded on
// success and ends the error otherwise.
func (t tool) run(ctx context.Context, args ...string) error {
	return t.runEnv(ctx, nil, args...)
}

// runEnv is run with env added to the tools' environment.
func (t tool) runEnv(ctx context.Context, env []string, args ...string) error {
	bin, err := t.find()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(append([]string(nil), toolEnv...), env...)
	out := &tailBuffer{max: maxToolOutput}
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", t.name, ctx.Err())
		}
		msg := strings.TrimSpace(out.String())
		if msg != "" {
			msg = ": " + strings.ReplaceAll(msg, "\n", " | ")
		}
		return fmt.Errorf("%s %s: %w%s", t.name, strings.Join(args, " "), err, msg)
	}
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	buf bytes.Buffer
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) > b.max {
		p = p[len(p)-b.max:]
	}
	if over := b.buf.Len() + len(p) - b.max; over > 0 {
		b.buf.Next(over)
	}
	b.buf.Write(p)
	return n, nil
}

func (b *tailBuffer) String() string { return b.buf.String() }
