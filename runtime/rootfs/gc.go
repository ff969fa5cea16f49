package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// DefaultGCMinIdle is how long GC keeps an unreferenced layer image whose
// snapshot still exists: long enough that a container restarted later the
// same day finds its layers built.
const DefaultGCMinIdle = 24 * time.Hour

// tmpGrace spares files in tmp/ younger than this. Builds write there
// only under the shared cache lock, which GC's exclusive lock rules out, so
// this is insurance against a writer that does not follow that rule, not
// part of the locking.
const tmpGrace = time.Minute

// GCOptions tune GC. The zero value is usable.
type GCOptions struct {
	// MinIdle keeps an unreferenced image whose snapshot directory still
	// exists until it has gone unused this long; 0 means
	// DefaultGCMinIdle, a negative value removes it at once. An image
	// whose snapshot is gone (containerd removed the image) can never be
	// used again and goes at once.
	MinIdle time.Duration
	// Live reports whether a container directory that references layers
	// is still in use. Nil means: while the directory exists. A reference
	// whose owner is not live is dropped.
	Live func(dir string) bool
	// Removed, if set, is called for each image removed.
	Removed func(Layer)
}

// GC removes the layer images no container references and, unless their
// snapshot is gone, that have been unused for opts.MinIdle, and the
// leftovers of interrupted builds. It never removes an image a live
// container references: it holds the cache lock exclusively, so no Prepare
// can be between finding an image and referencing it. It waits for that
// lock, bounded by ctx, while Prepares build layers. It returns how many
// images it removed and the bytes they held on disk.
func (c *Cache) GC(ctx context.Context, opts GCOptions) (removed int, freed int64, err error) {
	if opts.MinIdle == 0 {
		opts.MinIdle = DefaultGCMinIdle
	}
	if opts.Live == nil {
		opts.Live = dirExists
	}
	lk, err := lockFile(ctx, c.lockPath(), unix.LOCK_EX)
	if err != nil {
		return 0, 0, err
	}
	defer lk.Unlock()

	var errs []error
	c.removeStaleTmp(ctx)
	keys, err := c.keys()
	if err != nil {
		return 0, 0, err
	}
	for _, key := range keys {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		live, lastUse, err := c.liveRefs(ctx, key, opts.Live)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if live > 0 {
			continue
		}
		l, infoErr := c.readInfo(key)
		if infoErr == nil && l.Built.After(lastUse) {
			lastUse = l.Built
		}
		if infoErr == nil && sourceExists(l) && opts.MinIdle > 0 && time.Since(lastUse) < opts.MinIdle {
			continue
		}
		if infoErr != nil {
			l = Layer{Key: key, Image: c.imagePath(key)}
		}
		size, err := c.remove(key)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
		freed += size
		log.G(ctx).WithFields(log.Fields{"key": key[:12], "source": l.Source, "freed": size}).Info("layer image removed")
		if opts.Removed != nil {
			opts.Removed(l)
		}
	}
	errs = append(errs, c.removeOrphans(keys))
	return removed, freed, errors.Join(errs...)
}

// Layers lists the images in the cache.
func (c *Cache) Layers() ([]Layer, error) {
	keys, err := c.keys()
	if err != nil {
		return nil, err
	}
	var out []Layer
	for _, key := range keys {
		l, err := c.readInfo(key)
		if err != nil {
			l = Layer{Key: key, Image: c.imagePath(key)}
		}
		out = append(out, l)
	}
	return out, nil
}

// keys lists the keys of the images in place.
func (c *Cache) keys() ([]string, error) {
	ents, err := os.ReadDir(c.imagesDir())
	if err != nil {
		return nil, fmt.Errorf("layer cache: %w", err)
	}
	var keys []string
	for _, e := range ents {
		if key, ok := strings.CutSuffix(e.Name(), ".erofs"); ok && isKey(key) {
			keys = append(keys, key)
		}
	}
	return keys, nil
}

// liveRefs counts the live references of key, dropping the others, and
// returns when the layer was last referenced or released (the mtime of
// its refs directory, which every reference added or removed updates).
func (c *Cache) liveRefs(ctx context.Context, key string, live func(string) bool) (int, time.Time, error) {
	dir := c.keyRefsDir(key)
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, time.Time{}, nil
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("layer cache: %w", err)
	}
	lastUse := fi.ModTime()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("layer cache: %w", err)
	}
	n := 0
	for _, e := range ents {
		ref := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(ref)
		owner := strings.TrimSpace(string(data))
		if err == nil && filepath.IsAbs(owner) && ownerName(owner) == e.Name() && live(owner) {
			n++
			continue
		}
		// Its container directory is gone (the container was deleted
		// without Release, or its shim crashed): the reference is
		// stale. A reference that cannot be read came from a crash
		// mid-write: the Prepare that wrote it failed.
		log.G(ctx).WithFields(log.Fields{"key": key[:12], "owner": owner}).Debug("dropping stale layer reference")
		os.Remove(ref)
		lastUse = time.Now()
	}
	return n, lastUse, nil
}

// sourceExists reports whether the snapshot an image was built from is
// still there: the same directory, not another one at the same path that
// may even have reused its inode number. A snapshot that changed since
// keeps its image until MinIdle: it cannot be served again, but telling
// takes a walk of the tree, too slow under GC's exclusive lock.
func sourceExists(l Layer) bool {
	var st unix.Stat_t
	if err := unix.Stat(l.Source, &st); err != nil {
		return false
	}
	return st.Dev == l.SourceDev && st.Ino == l.SourceIno && st.Ctim.Nano() == l.SourceCtime
}

// remove deletes an image and everything kept for it; it returns the disk
// space the image held. The caller holds the cache lock exclusively.
func (c *Cache) remove(key string) (int64, error) {
	var size int64
	var st unix.Stat_t
	if err := unix.Stat(c.imagePath(key), &st); err == nil {
		size = st.Blocks * 512
	}
	// The image first: an image without its record is invalid, never
	// served.
	if err := os.Remove(c.imagePath(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("layer cache: %w", err)
	}
	return size, errors.Join(
		removeIfExists(c.infoPath(key)),
		removeAllIfExists(c.keyRefsDir(key)),
		removeIfExists(c.keyLockPath(key)),
	)
}

// removeOrphans removes records, reference directories and build locks of
// keys that have no image. The caller holds the cache lock exclusively, so
// no build holds a key lock.
func (c *Cache) removeOrphans(keys []string) error {
	have := make(map[string]bool, len(keys))
	for _, k := range keys {
		have[k] = true
	}
	var errs []error
	if ents, err := os.ReadDir(c.imagesDir()); err == nil {
		for _, e := range ents {
			if key, ok := strings.CutSuffix(e.Name(), ".json"); ok && !have[key] {
				errs = append(errs, removeIfExists(filepath.Join(c.imagesDir(), e.Name())))
			}
		}
	}
	for _, d := range []string{c.refsDir(), c.locksDir()} {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !have[e.Name()] {
				errs = append(errs, removeAllIfExists(filepath.Join(d, e.Name())))
			}
		}
	}
	return errors.Join(errs...)
}

// removeStaleTmp removes what interrupted builds left in tmp/. No build
// runs while GC holds the cache lock exclusively.
func (c *Cache) removeStaleTmp(ctx context.Context) {
	ents, err := os.ReadDir(c.tmpDir())
	if err != nil {
		return
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < tmpGrace {
			continue
		}
		p := filepath.Join(c.tmpDir(), e.Name())
		if err := os.RemoveAll(p); err != nil {
			log.G(ctx).WithError(err).WithField("path", p).Warn("remove leftover layer build")
		}
	}
}

func removeIfExists(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("layer cache: %w", err)
	}
	return nil
}

func removeAllIfExists(p string) error {
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("layer cache: %w", err)
	}
	return nil
}

// dirExists is the default liveness of a reference's owner.
func dirExists(dir string) bool {
	fi, err := os.Stat(dir)
	return err == nil && fi.IsDir()
}
