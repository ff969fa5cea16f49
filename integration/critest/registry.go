package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// localRegistry is an in-memory OCI distribution registry served over
// plain HTTP on 127.0.0.1, the one containerd's hosts.toml mirrors every
// public registry to.
type localRegistry struct {
	// addr is its host:port.
	addr string
	srv  *http.Server
	// done is closed when the server has stopped serving.
	done chan struct{}
}

// startRegistry serves an empty registry on a free port of 127.0.0.1.
func startRegistry() (*localRegistry, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &localRegistry{
		addr: l.Addr().String(),
		srv: &http.Server{
			Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
			ReadHeaderTimeout: 10 * time.Second,
		},
		done: make(chan struct{}),
	}
	go func() {
		_ = r.srv.Serve(l)
		close(r.done)
	}()
	return r, nil
}

// push puts each image under each of its names, with the registry's host
// in place of the original's (gcr.io/k8s-staging-cri-tools/test-image-1:latest
// is k8s-staging-cri-tools/test-image-1:latest here): what containerd asks
// a mirror for. Names of two registries with the same path are one image.
func (r *localRegistry) push(ctx context.Context, images []builtImage) error {
	for _, b := range images {
		for _, ref := range b.refs {
			orig, err := name.ParseReference(ref)
			if err != nil {
				return err
			}
			local, err := name.ParseReference(r.addr + "/" + orig.Context().RepositoryStr() + ":" + orig.Identifier())
			if err != nil {
				return err
			}
			if err := remote.Write(local, b.img, remote.WithContext(ctx)); err != nil {
				return fmt.Errorf("push %s as %s: %w", ref, local, err)
			}
		}
	}
	return nil
}

// stop ends the server.
func (r *localRegistry) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
	<-r.done
}
