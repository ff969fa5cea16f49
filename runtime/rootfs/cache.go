package rootfs

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// CacheDirName is the layer cache's directory under runtime.data_dir.
const CacheDirName = "layers"

// DefaultScratchSize is the apparent size of a scratch disk: what the
// container can write. The file is sparse and grows only with what is
// written.
const DefaultScratchSize int64 = 10 << 30

// minScratchSize is the smallest scratch disk mkfs.ext4 is asked to make.
const minScratchSize int64 = 16 << 20

// keyVersion is hashed into every cache key. Changing how images are built
// (mkfs options, compression) changes it, so that old images are never
// served; GC removes them.
const keyVersion = "cocoon-layer-v2 erofs uncompressed reproducible"

// Cache is the host's cache of layer images, in one directory:
//
//	lock                  Prepare holds it shared, GC exclusive
//	images/<key>.erofs    layer images, immutable once renamed into place
//	images/<key>.json     what each image was built from (Layer)
//	refs/<key>/<owner>    one file per container directory using the layer
//	locks/<key>           taken while the layer is built
//	tmp/                  images being built
//
// Several shims share one cache: every step is safe against other
// processes, through flock(2) and atomic renames, not in-process state.
type Cache struct {
	// dir is the cache's directory, absolute.
	dir string
	// copyBack bounds CopyBack; zero fields take the defaults.
	copyBack CopyBackLimits
}

// Option adjusts a Cache when it is opened.
type Option func(*Cache)

// WithCopyBackLimits bounds what CopyBack takes from a guest; zero fields
// keep the defaults (DefaultCopyBackMaxBytes, DefaultCopyBackTimeout, no
// rate cap).
func WithCopyBackLimits(l CopyBackLimits) Option {
	return func(c *Cache) { c.copyBack = l }
}

// copyBackLimits are the limits with the defaults filled in.
func (c *Cache) copyBackLimits() CopyBackLimits {
	l := c.copyBack
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultCopyBackMaxBytes
	}
	if l.Timeout <= 0 {
		l.Timeout = DefaultCopyBackTimeout
	}
	return l
}

// Open opens the cache in dir (<runtime.data_dir>/layers), creating it if
// need be.
func Open(dir string, opts ...Option) (*Cache, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("%w: layer cache dir %q is not an absolute path", errdefs.ErrInvalidArgument, dir)
	}
	c := &Cache{dir: filepath.Clean(dir)}
	for _, o := range opts {
		o(c)
	}
	for _, d := range []string{c.dir, c.imagesDir(), c.refsDir(), c.locksDir(), c.tmpDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("layer cache: %w", err)
		}
	}
	return c, nil
}

// Dir returns the cache's directory.
func (c *Cache) Dir() string { return c.dir }

func (c *Cache) lockPath() string                 { return filepath.Join(c.dir, "lock") }
func (c *Cache) imagesDir() string                { return filepath.Join(c.dir, "images") }
func (c *Cache) refsDir() string                  { return filepath.Join(c.dir, "refs") }
func (c *Cache) locksDir() string                 { return filepath.Join(c.dir, "locks") }
func (c *Cache) tmpDir() string                   { return filepath.Join(c.dir, "tmp") }
func (c *Cache) imagePath(key string) string      { return filepath.Join(c.imagesDir(), key+".erofs") }
func (c *Cache) infoPath(key string) string       { return filepath.Join(c.imagesDir(), key+".json") }
func (c *Cache) keyRefsDir(key string) string     { return filepath.Join(c.refsDir(), key) }
func (c *Cache) keyLockPath(key string) string    { return filepath.Join(c.locksDir(), key) }
func (c *Cache) refPath(key, owner string) string { return filepath.Join(c.refsDir(), key, owner) }

// Layer describes one cached layer image.
type Layer struct {
	// Key names the image in the cache.
	Key string `json:"key"`
	// Image is the EROFS image's path (set when read, not stored).
	Image string `json:"-"`
	// Source is the snapshot directory it was built from; SourceDev,
	// SourceIno and SourceCtime (ns) identify that directory.
	Source      string `json:"source"`
	SourceDev   uint64 `json:"source_dev"`
	SourceIno   uint64 `json:"source_ino"`
	SourceCtime int64  `json:"source_ctime_ns"`
	// Fingerprint is the hex SHA-256 over the source tree's metadata.
	Fingerprint string `json:"fingerprint"`
	// Entries and Bytes count the source's entries and regular file bytes.
	Entries int64 `json:"entries"`
	Bytes   int64 `json:"bytes"`
	// ImageBytes is the image file's size.
	ImageBytes int64 `json:"image_bytes"`
	// Digest is the image file's "sha256:<hex>". Images are built
	// reproducibly (reproducibleArgs), so a layer rebuilt after GC has
	// the digest it had: what a checkpoint that used it records.
	Digest string `json:"digest"`
	// Built is when it was built, and BuildMillis how long that took.
	Built       time.Time `json:"built"`
	BuildMillis int64     `json:"build_ms"`
}

// PrepareOpt adjusts one Prepare call.
type PrepareOpt func(*prepareConfig)

type prepareConfig struct {
	scratchSize int64
	fill        func(*os.File) error
}

// WithScratchFrom makes Prepare write the scratch disk with fill, given
// the new empty file, instead of making a filesystem seeded from the
// upperdir: a container restored from a checkpoint gets the disk it had.
// The scratch size is then what fill writes.
func WithScratchFrom(fill func(*os.File) error) PrepareOpt {
	return func(c *prepareConfig) { c.fill = fill }
}

// WithScratchSize sets the apparent size of the scratch disk in bytes
// (rounded down to 4 KiB); 0 keeps DefaultScratchSize.
func WithScratchSize(bytes int64) PrepareOpt {
	return func(c *prepareConfig) {
		if bytes != 0 {
			c.scratchSize = bytes
		}
	}
}

// Prepare turns the mounts of a container's root into disks: an EROFS
// image per read-only layer, from the cache (built on a miss), and, unless
// the root is read-only, a sparse ext4 scratch disk in dir seeded with the
// overlay upperdir's content.
//
// dir is the container's own directory (created if missing; one per
// container). The layers stay referenced, and so out of GC's reach, until
// Release or until dir is removed. Mounts the cache cannot serve fail with
// errdefs.ErrNotImplemented or errdefs.ErrInvalidArgument naming the mount
// or option; a missing layer directory with errdefs.ErrNotFound; a dir
// that already holds a scratch disk with errdefs.ErrAlreadyExists. On
// error nothing is left behind but cache entries that were built.
func (c *Cache) Prepare(ctx context.Context, mounts []Mount, dir string, opts ...PrepareOpt) (_ Rootfs, retErr error) {
	cfg := prepareConfig{scratchSize: DefaultScratchSize}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.scratchSize &^= 4<<10 - 1
	if cfg.scratchSize < minScratchSize {
		return Rootfs{}, fmt.Errorf("%w: scratch size %d bytes is below the minimum of %d", errdefs.ErrInvalidArgument, cfg.scratchSize, minScratchSize)
	}
	p, err := parseMounts(mounts)
	if err != nil {
		return Rootfs{}, err
	}
	if !filepath.IsAbs(dir) {
		return Rootfs{}, fmt.Errorf("%w: container dir %q is not an absolute path", errdefs.ErrInvalidArgument, dir)
	}
	dir = filepath.Clean(dir)
	if p.upper != "" {
		fi, err := os.Stat(p.upper)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return Rootfs{}, fmt.Errorf("%w: overlay upperdir %s does not exist", errdefs.ErrNotFound, p.upper)
		case err != nil:
			return Rootfs{}, fmt.Errorf("overlay upperdir: %w", err)
		case !fi.IsDir():
			return Rootfs{}, fmt.Errorf("%w: overlay upperdir %s is not a directory", errdefs.ErrInvalidArgument, p.upper)
		}
	}
	r := Rootfs{Dir: dir}
	if !p.readOnly {
		r.Scratch = filepath.Join(dir, ScratchFile)
		r.Upper, r.Bind, r.Lowers = p.upper, p.rootFrom, p.lowers
		if _, err := os.Lstat(r.Scratch); err == nil {
			return Rootfs{}, fmt.Errorf("%w: %s already exists; Release the container's rootfs first", errdefs.ErrAlreadyExists, r.Scratch)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Rootfs{}, fmt.Errorf("container dir: %w", err)
	}
	if r.Scratch != "" && onTmpfs(dir) {
		log.G(ctx).WithField("dir", dir).Warn("container dir is on tmpfs: what the container writes to its scratch disk takes host memory")
	}
	start := time.Now()

	keys, added, hits, err := c.acquireLayers(ctx, p.lowers, dir)
	if err != nil {
		return Rootfs{}, err
	}
	defer func() {
		if retErr != nil {
			for _, ref := range added {
				os.Remove(ref)
			}
		}
	}()
	for _, key := range keys {
		r.Layers = append(r.Layers, c.imagePath(key))
	}

	layersDone := time.Now()
	switch {
	case r.Scratch != "" && cfg.fill != nil:
		if err := fillScratch(r.Scratch, cfg.fill); err != nil {
			return Rootfs{}, err
		}
	case r.Scratch != "":
		if err := makeScratch(ctx, r.Scratch, cfg.scratchSize, p.upper, p.rootFrom); err != nil {
			return Rootfs{}, err
		}
	}
	log.G(ctx).WithFields(log.Fields{
		"dir":          dir,
		"layers":       len(keys),
		"layer_hits":   hits,
		"layers_ms":    layersDone.Sub(start).Milliseconds(),
		"scratch_ms":   time.Since(layersDone).Milliseconds(),
		"read_only":    p.readOnly,
		"scratch_size": cfg.scratchSize,
	}).Debug("rootfs prepared")
	return r, nil
}

// acquireLayers makes sure the images of the source directories exist and
// references them for the container directory dir. It returns their keys
// (in the order of sources), the reference files it added, and how many
// images were already cached. On error it leaves no reference behind.
func (c *Cache) acquireLayers(ctx context.Context, sources []string, dir string) (keys, added []string, hits int, retErr error) {
	// Shared: GC, which takes it exclusively, cannot remove an image
	// between the moment it is found here and the moment it is
	// referenced.
	lk, err := lockFile(ctx, c.lockPath(), unix.LOCK_SH)
	if err != nil {
		return nil, nil, 0, err
	}
	defer lk.Unlock()

	keys, hits, err = c.ensureLayers(ctx, sources)
	if err != nil {
		return nil, nil, 0, err
	}
	// A local list: the named result is reset by an error return before
	// deferred functions run.
	var refs []string
	defer func() {
		if retErr != nil {
			for _, ref := range refs {
				os.Remove(ref)
			}
		}
	}()
	owner := ownerName(dir)
	for _, key := range keys {
		ref := c.refPath(key, owner)
		if _, err := os.Lstat(ref); err == nil {
			continue // a duplicate lowerdir, or a dir prepared before
		}
		if err := os.MkdirAll(c.keyRefsDir(key), 0o700); err != nil {
			return nil, nil, 0, fmt.Errorf("layer cache: %w", err)
		}
		if err := os.WriteFile(ref, []byte(dir+"\n"), 0o600); err != nil {
			return nil, nil, 0, fmt.Errorf("layer cache: reference layer %s: %w", key, err)
		}
		refs = append(refs, ref)
	}
	return keys, refs, hits, nil
}

// maxParallelBuilds bounds the layer images one Prepare builds at once.
const maxParallelBuilds = 4

// ensureLayers makes sure an image exists for each source directory and
// returns their keys in the same order, and how many were already cached.
// The caller holds the cache lock shared.
func (c *Cache) ensureLayers(ctx context.Context, sources []string) ([]string, int, error) {
	keys := make([]string, len(sources))
	hit := make([]bool, len(sources))
	errs := make([]error, len(sources))
	sem := make(chan struct{}, max(1, min(maxParallelBuilds, runtime.NumCPU())))
	var wg sync.WaitGroup
	for i, src := range sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			keys[i], hit[i], errs[i] = c.ensureLayer(ctx, src)
		}()
	}
	wg.Wait()
	hits := 0
	for i := range sources {
		if errs[i] != nil {
			return nil, 0, errs[i]
		}
		if hit[i] {
			hits++
		}
	}
	return keys, hits, nil
}

// ensureLayer returns the key of src's image, building it unless cached.
func (c *Cache) ensureLayer(ctx context.Context, src string) (key string, hit bool, retErr error) {
	snap, err := fingerprint(ctx, src)
	if err != nil {
		return "", false, err
	}
	key = cacheKey(snap)
	if c.valid(key) {
		return key, true, nil
	}

	// Another shim may be building the same layer: one builds, the
	// others wait here and then find the image.
	lk, err := lockFile(ctx, c.keyLockPath(key), unix.LOCK_EX)
	if err != nil {
		return "", false, err
	}
	defer lk.Unlock()
	if c.valid(key) {
		return key, true, nil
	}
	if err := c.build(ctx, snap, key); err != nil {
		return "", false, err
	}
	return key, false, nil
}

// cacheKey names the image of a source tree. It covers the directory's
// path and inode and the fingerprint of the whole tree, so a changed tree
// gets a new key: an image, once built, is never rebuilt in place.
func cacheKey(s snapshot) string {
	h := sha256.New()
	h.Write([]byte(keyVersion))
	h.Write([]byte{0})
	h.Write([]byte(s.path))
	h.Write([]byte{0})
	h.Write(binary.LittleEndian.AppendUint64(nil, s.ino))
	h.Write(s.sum[:])
	return hex.EncodeToString(h.Sum(nil))
}

// valid reports whether the image for key is in place and whole: its
// record exists and its size is the one recorded. A torn or truncated
// image (a crash before its data reached the disk) is not valid; the next
// build replaces it. Callers hold the cache lock shared or exclusive.
func (c *Cache) valid(key string) bool {
	fi, err := os.Stat(c.imagePath(key))
	if err != nil {
		return false
	}
	l, err := c.readInfo(key)
	return err == nil && l.ImageBytes == fi.Size() && fi.Size() > 0
}

// readInfo reads an image's record.
func (c *Cache) readInfo(key string) (Layer, error) {
	data, err := os.ReadFile(c.infoPath(key))
	if err != nil {
		return Layer{}, err
	}
	var l Layer
	if err := json.Unmarshal(data, &l); err != nil {
		return Layer{}, fmt.Errorf("layer record %s: %w", c.infoPath(key), err)
	}
	l.Key = key
	l.Image = c.imagePath(key)
	return l, nil
}

// build makes the EROFS image of snap under key. The image is written to
// tmp/, checked against a second walk of the source (a layer that changed
// while mkfs.erofs read it is not cached), synced, recorded and renamed
// into place. The caller holds the key's lock.
func (c *Cache) build(ctx context.Context, snap snapshot, key string) (retErr error) {
	start := time.Now()
	f, err := os.CreateTemp(c.tmpDir(), key+".*.erofs")
	if err != nil {
		return fmt.Errorf("layer cache: %w", err)
	}
	tmp := f.Name()
	f.Close()
	defer func() {
		if retErr != nil {
			os.Remove(tmp)
		}
	}()
	// Uncompressed: measured here, mkfs takes about as long as with lz4
	// and the guest reads it without spending emulated CPU on
	// decompression (docs/rootfs.md).
	if err := toolMkfsErofs.runEnv(ctx, reproducibleEnv, append(reproducibleArgs(key), "--quiet", "--preserve-mtime", tmp, snap.path)...); err != nil {
		return fmt.Errorf("build layer image of %s: %w", snap.path, err)
	}
	after, err := fingerprint(ctx, snap.path)
	if err != nil {
		return err
	}
	if after.sum != snap.sum {
		return fmt.Errorf("%w: layer %s changed while its image was built; not cached", errdefs.ErrAborted, snap.path)
	}
	f, err = os.Open(tmp)
	if err != nil {
		return fmt.Errorf("layer cache: %w", err)
	}
	err = f.Sync()
	fi, statErr := f.Stat()
	h := sha256.New()
	_, hashErr := io.Copy(h, f)
	f.Close()
	if err = errors.Join(err, statErr, hashErr); err != nil {
		return fmt.Errorf("layer cache: sync %s: %w", tmp, err)
	}
	l := Layer{
		Key:         key,
		Source:      snap.path,
		SourceDev:   snap.dev,
		SourceIno:   snap.ino,
		SourceCtime: snap.ctime,
		Fingerprint: hex.EncodeToString(snap.sum[:]),
		Entries:     snap.entries,
		Bytes:       snap.bytes,
		ImageBytes:  fi.Size(),
		Digest:      "sha256:" + hex.EncodeToString(h.Sum(nil)),
		Built:       time.Now().UTC(),
		BuildMillis: time.Since(start).Milliseconds(),
	}
	// The record first: an image in place always has one.
	if err := writeFileAtomic(c.infoPath(key), l, c.tmpDir()); err != nil {
		return err
	}
	if err := os.Rename(tmp, c.imagePath(key)); err != nil {
		os.Remove(c.infoPath(key))
		return fmt.Errorf("layer cache: %w", err)
	}
	syncDir(c.imagesDir())
	log.G(ctx).WithFields(log.Fields{
		"layer":       snap.path,
		"key":         key[:12],
		"entries":     l.Entries,
		"bytes":       l.Bytes,
		"image_bytes": l.ImageBytes,
		"build_ms":    l.BuildMillis,
	}).Info("layer image built")
	return nil
}

// reproducibleEnv and reproducibleArgs make mkfs.erofs write the same
// bytes for the same tree: its build time (the superblock's, and the
// mtime of inodes that use the compact format) would be the time of the
// build and its UUID random. A build time at the end of 32-bit time keeps
// every file's own mtime (mkfs.erofs clamps mtimes to it) and the UUID
// comes from the key, so a layer rebuilt after GC is the image a
// checkpoint's guest has in its page cache.
var reproducibleEnv = []string{"SOURCE_DATE_EPOCH=4294967295"}

func reproducibleArgs(key string) []string {
	u := key[:32]
	return []string{"-U", u[0:8] + "-" + u[8:12] + "-" + u[12:16] + "-" + u[16:20] + "-" + u[20:32]}
}

// LayerDigest returns the digest ("sha256:<hex>") of a layer image that
// Prepare returned.
func (c *Cache) LayerDigest(img string) (string, error) {
	key, ok := c.keyOf(img)
	if !ok {
		return "", fmt.Errorf("%w: %s is not an image of the layer cache %s", errdefs.ErrInvalidArgument, img, c.dir)
	}
	l, err := c.readInfo(key)
	if err != nil {
		return "", fmt.Errorf("layer cache: %w", err)
	}
	if l.Digest == "" {
		return "", fmt.Errorf("%w: layer image %s has no recorded digest", errdefs.ErrNotFound, img)
	}
	return l.Digest, nil
}

// writeFileAtomic writes v as JSON to path through a synced temporary file
// in tmpDir and a rename.
func writeFileAtomic(path string, v any, tmpDir string) (retErr error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(tmpDir, filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("layer cache: %w", err)
	}
	defer func() {
		if retErr != nil {
			os.Remove(f.Name())
		}
	}()
	_, err = f.Write(append(data, '\n'))
	err = errors.Join(err, f.Sync(), f.Close())
	if err != nil {
		return fmt.Errorf("layer cache: write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("layer cache: %w", err)
	}
	return nil
}

// syncDir makes a rename in dir durable; failures only cost durability.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// ownerName is a container directory's reference name: fixed length
// whatever the path, and the same for the same path.
func ownerName(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return hex.EncodeToString(sum[:16])
}

// Release gives back what Prepare made for r: the layer references and
// the scratch disk. Call it once the VM no longer uses the disks (detached,
// or the VM stopped). It is idempotent; the layer images stay in the cache
// for GC to judge.
func (c *Cache) Release(ctx context.Context, r Rootfs) error {
	if r.Dir == "" {
		if len(r.Layers) == 0 && r.Scratch == "" {
			return nil
		}
		return fmt.Errorf("%w: rootfs to release has no container dir", errdefs.ErrInvalidArgument)
	}
	owner := ownerName(filepath.Clean(r.Dir))
	var errs []error
	for _, img := range r.Layers {
		key, ok := c.keyOf(img)
		if !ok {
			errs = append(errs, fmt.Errorf("%w: layer %s is not an image of the cache in %s", errdefs.ErrInvalidArgument, img, c.dir))
			continue
		}
		if err := os.Remove(c.refPath(key, owner)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("layer cache: %w", err))
		}
	}
	if r.Scratch != "" {
		// Only ever the scratch disk Prepare made, whatever a corrupted
		// record may say.
		if r.Scratch != filepath.Join(filepath.Clean(r.Dir), ScratchFile) {
			errs = append(errs, fmt.Errorf("%w: scratch %s is not %s in %s", errdefs.ErrInvalidArgument, r.Scratch, ScratchFile, r.Dir))
		} else if err := os.Remove(r.Scratch); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove scratch disk: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	log.G(ctx).WithField("dir", r.Dir).Debug("rootfs released")
	return nil
}

// keyOf returns the key of an image path of this cache.
func (c *Cache) keyOf(img string) (string, bool) {
	if filepath.Dir(filepath.Clean(img)) != c.imagesDir() {
		return "", false
	}
	key, ok := strings.CutSuffix(filepath.Base(img), ".erofs")
	return key, ok && isKey(key)
}

// isKey reports whether s has the shape of a cache key (hex SHA-256).
func isKey(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// onTmpfs reports whether dir is on a memory-backed filesystem.
func onTmpfs(dir string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(dir, &fs) == nil && fs.Type == unix.TMPFS_MAGIC
}
