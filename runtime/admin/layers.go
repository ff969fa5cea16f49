package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/cocoonrt/cocoon/runtime/rootfs"
)

// LayerCacheDir is the layer cache's directory under runtime.data_dir.
func (e *Env) LayerCacheDir() string {
	return filepath.Join(e.Config.Runtime.DataDir, rootfs.CacheDirName)
}

// GCLayers removes the layer images no container uses any more (see
// rootfs.Cache.GC): images whose snapshot containerd has removed, and
// those unused for a day. A container's layers stay referenced while its
// directory under the state dir exists, so run it after GC, which removes
// the state of sandboxes whose VMM is gone.
func (e *Env) GCLayers(ctx context.Context, w io.Writer, minIdle time.Duration) error {
	dir := e.LayerCacheDir()
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(w, "layer cache %s: empty\n", dir)
		return nil
	}
	c, err := rootfs.Open(dir)
	if err != nil {
		return err
	}
	opts := rootfs.GCOptions{MinIdle: minIdle, Removed: func(l rootfs.Layer) {
		src := l.Source
		if src == "" {
			src = "unknown source"
		}
		fmt.Fprintf(w, "removed layer image %s (%s)\n", l.Key[:12], src)
	}}
	removed, freed, err := c.GC(ctx, opts)
	fmt.Fprintf(w, "layer cache %s: removed %d images, freed %s\n", dir, removed, humanBytes(freed))
	if err != nil {
		return fmt.Errorf("layer cache gc: %w", err)
	}
	return nil
}

// humanBytes renders a byte count with a binary unit.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
