package rootfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestMeasure reports the numbers docs/rootfs.md quotes: the cost of a
// layer image on a miss and on a hit, and of a scratch disk. Layers are
// copies of host trees when they exist (realistic file mixes), else
// generated.
func TestMeasure(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	needTools(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		sources []string
		files   int
		size    int
	}{
		{"~5 MiB layer", []string{"/usr/share/perl5", "/etc"}, 500, 10 << 10},
		{"~50 MiB layer", []string{"/usr/lib/python3.11"}, 2000, 25 << 10},
	} {
		layer := filepath.Join(t.TempDir(), "fs")
		copied := true
		for _, src := range tc.sources {
			if _, err := os.Stat(src); err != nil {
				copied = false
				break
			}
			os.MkdirAll(layer, 0o755)
			if out, err := exec.Command("cp", "-a", src, layer+"/").CombinedOutput(); err != nil {
				t.Logf("cp %s: %v %s", src, err, out)
				copied = false
				break
			}
		}
		if !copied {
			os.RemoveAll(layer)
			writeManyFiles(t, layer, tc.files, tc.size)
		}
		snap := mustFingerprint(t, layer)

		c := openCache(t)
		start := time.Now()
		r := prepareOne(t, c, layer)
		miss := time.Since(start)
		start = time.Now()
		prepareOne(t, c, layer)
		hit := time.Since(start)
		fi, _ := os.Stat(r.Layers[0])

		// The same with lz4, to back the choice of no compression.
		lz4 := filepath.Join(t.TempDir(), "lz4.erofs")
		start = time.Now()
		if out, err := exec.Command("mkfs.erofs", "--quiet", "-zlz4", lz4, layer).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.erofs -zlz4: %v %s", err, out)
		}
		lz4Time := time.Since(start)
		lz4fi, _ := os.Stat(lz4)
		lz4Size := lz4fi.Size()
		t.Logf("%s (%d entries, %.1f MiB): miss %v (image %.1f MiB), hit %v; lz4 mkfs alone %v (%.1f MiB)",
			tc.name, snap.entries, float64(snap.bytes)/(1<<20), miss.Round(time.Millisecond), float64(fi.Size())/(1<<20),
			hit.Round(time.Millisecond), lz4Time.Round(time.Millisecond), float64(lz4Size)/(1<<20))
	}

	var times []time.Duration
	for range 5 {
		dir := t.TempDir()
		start := time.Now()
		if err := makeScratch(ctx, filepath.Join(dir, ScratchFile), DefaultScratchSize, "", ""); err != nil {
			t.Fatal(err)
		}
		times = append(times, time.Since(start).Round(100*time.Microsecond))
	}
	t.Logf("scratch disk (%d GiB sparse ext4, empty upperdir): %v", DefaultScratchSize>>30, times)
}
