package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
	"github.com/cocoonrt/cocoon/runtime/config"
)

// errDockerTools is returned when dockerd or the docker CLI is missing.
var errDockerTools = errors.New("the Docker figures need dockerd and the docker CLI (make test-deps)")

// dockerFigures are Docker's figures, index 0 Cocoon, 1 runc: ms each.
type dockerFigures struct {
	// run is `docker run --rm IMAGE true`, end to end as the CLI sees
	// it (create, start, attach, wait, remove).
	run [2][]float64
	// exec is `docker exec CONTAINER true` in a running container.
	exec [2][]float64
}

// dockerRuntimes are the `docker run --runtime` names compared: index 0
// Cocoon, 1 runc.
var dockerRuntimes = [2]string{harness.DockerCocoonRuntime, "runc"}

// benchDocker takes Docker's figures with a private dockerd (moby v2, as
// the integration tests run it) on a private containerd 1.6, Cocoon's and
// runc's samples alternated, n of each. The containers are on Docker's
// default bridge network, so Cocoon's VMs bind their interface at start.
func benchDocker(ctx context.Context, cfg *config.Config, n int) (f dockerFigures, retErr error) {
	b, err := startCtrd(cfg.Runtime.StateDir, cfg.Runtime.DataDir)
	if err != nil {
		return f, err
	}
	defer b.close()
	d, err := harness.OpenDocker(b.c)
	if errors.Is(err, harness.ErrDockerNotInstalled) {
		return f, fmt.Errorf("%w: %v", errDockerTools, err)
	}
	if err != nil {
		return f, err
	}
	// Before containerd stops (b.close, deferred first).
	defer func() {
		if err := d.Cleanup(); err != nil && retErr == nil {
			retErr = fmt.Errorf("docker cleanup: %w", err)
		}
		if left := d.Leftovers(); left != "" && retErr == nil {
			retErr = fmt.Errorf("left on the host after the Docker figures:\n%s", left)
		}
	}()
	tmp, err := os.MkdirTemp("", "cocoon-bench-docker-")
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(tmp)
	archive, err := harness.BusyboxArchive(tmp)
	if err != nil {
		return f, err
	}
	if _, _, err := d.RunErr("load", "-i", archive); err != nil {
		return f, err
	}
	img := harness.BusyboxRef
	docker := func(args ...string) (float64, error) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		t := time.Now()
		_, _, err := d.RunErr(args...)
		return ms(time.Since(t)), err
	}
	for range n {
		for i, rt := range dockerRuntimes {
			v, err := docker("run", "--rm", "--runtime="+rt, img, "true")
			if err != nil {
				return f, err
			}
			f.run[i] = append(f.run[i], v)
		}
	}
	for i, rt := range dockerRuntimes {
		name := "bench-exec-" + rt
		if _, _, err := d.RunErr("run", "-d", "--name", name, "--runtime="+rt, img, "sleep", "3600"); err != nil {
			return f, err
		}
		for range n {
			v, err := docker("exec", name, "true")
			if err != nil {
				return f, err
			}
			f.exec[i] = append(f.exec[i], v)
		}
		if _, _, err := d.RunErr("rm", "-f", name); err != nil {
			return f, err
		}
	}
	return f, nil
}

// dockerResults are Docker's figures, Cocoon next to runc.
func dockerResults(f dockerFigures) []Result {
	pair := func(name string, s [2][]float64) Result {
		r := median(s[1])
		return Result{Name: name, Unit: "ms", Median: median(s[0]), Samples: s[0], Runc: &r, RuncSamples: s[1]}
	}
	return []Result{
		pair("docker run --rm true (bridge network)", f.run),
		pair("docker exec true", f.exec),
	}
}
