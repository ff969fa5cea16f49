package oci

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// MaxSpecBytes bounds the config.json read from a bundle.
const MaxSpecBytes = 16 << 20

// ReadBundleSpec reads the OCI spec of a bundle, its config.json.
func ReadBundleSpec(bundle string) (*specs.Spec, error) {
	if !filepath.IsAbs(bundle) {
		return nil, fmt.Errorf("bundle %q: %w: want an absolute path", bundle, errdefs.ErrInvalidArgument)
	}
	p := filepath.Join(bundle, "config.json")
	st, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("read OCI spec: %w", err)
	}
	if st.Size() > MaxSpecBytes {
		return nil, fmt.Errorf("OCI spec %s: %w: %d bytes, at most %d", p, errdefs.ErrInvalidArgument, st.Size(), MaxSpecBytes)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("read OCI spec: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("OCI spec %s: %w: %v", p, errdefs.ErrInvalidArgument, err)
	}
	return &s, nil
}
