package main

import (
	"context"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cocoonrt/cocoon/runtime/config"
)

// benchExecUser is the annotation the bench's containers with an exec
// user carry: a user the busybox image does not have.
const benchExecUser = "io.cocoon.exec-user=bench:4242:4242"

// execUserFigures are container starts with the exec user provisioned and
// without it, alternated, and the provisioning's own time in the guest as
// the shim logs it, in ms.
type execUserFigures struct{ with, without, guest []float64 }

// provisionedLine matches the shim's "exec user provisioned" line; its
// guest_us field is the guest's time for it.
var provisionedLine = regexp.MustCompile(`msg="exec user provisioned"(.*)`)

// execUserFigures times n `ctr run --rm true` with the exec user and n
// without, alternated so that drift of the host's speed falls on both.
func (b *ctrdBench) execUserFigures(ctx context.Context, n int) (f execUserFigures, err error) {
	for i := 0; i < n; i++ {
		for _, user := range []bool{false, true} {
			prefix, args := "nouser", []string{"run", "--rm", "--runtime", runtimeCocoon}
			if user {
				prefix, args = "user", append(args, "--annotation", benchExecUser)
			}
			id := b.newID(prefix)
			start := time.Now()
			if err := b.ctr(ctx, io.Discard, append(args, b.image, id, "true")...); err != nil {
				return f, err
			}
			took := ms(time.Since(start))
			delete(b.live, id)
			if user {
				f.with = append(f.with, took)
			} else {
				f.without = append(f.without, took)
			}
		}
	}
	f.guest, err = b.provisionTimes("user-", n)
	return f, err
}

// provisionTimes reads the guest's provisioning times of the containers
// whose ids start with prefix from containerd's log, in ms.
func (b *ctrdBench) provisionTimes(prefix string, want int) ([]float64, error) {
	return waitLog(b, "exec user lines for "+prefix+"*", want, func(lines []string) ([]float64, error) {
		var out []float64
		for _, line := range lines {
			m := provisionedLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			f := logFields(m[1])
			us, err := strconv.ParseFloat(f["guest_us"], 64)
			if !strings.HasPrefix(f["container"], prefix) || err != nil {
				continue
			}
			out = append(out, us/1000)
		}
		return out, nil
	})
}

// benchExecUserOnly measures the exec user figures alone.
func benchExecUserOnly(ctx context.Context, cfg *config.Config, n int) (f execUserFigures, retErr error) {
	b, err := startCtrd(cfg.Runtime.StateDir, cfg.Runtime.DataDir)
	if err != nil {
		return f, err
	}
	defer b.close()
	return b.execUserFigures(ctx, n)
}

// execUserResults are the exec user figures.
func execUserResults(f execUserFigures) []Result {
	added := []float64{median(f.with) - median(f.without)}
	return []Result{
		{Name: "ctr run --rm true, no exec user", Unit: "ms", Median: median(f.without), Samples: f.without},
		{Name: "ctr run --rm true, exec user provisioned", Unit: "ms", Median: median(f.with), Samples: f.with},
		{Name: "  provisioning in the guest (passwd, group, home)", Unit: "ms", Median: median(f.guest), Samples: f.guest,
			Target: "<= 20 ms (TCG)"},
		{Name: "  start with - start without (noise of the starts)", Unit: "ms", Median: added[0], Samples: added},
	}
}
