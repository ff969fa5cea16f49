// Package oci holds pure functions over OCI runtime specs: annotation
// parsing and validation now, host-to-guest translation of mounts and
// devices with the shim.
package oci

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/config"
)

// AnnotationPrefix marks the annotations Cocoon reads. Every annotation
// under it must be one this package knows: a typo must not silently fall
// back to a default.
const AnnotationPrefix = "io.cocoon."

// Annotations Cocoon reads (docs/annotations.md).
const (
	// AnnotationVCPUs sets the sandbox's vCPU count.
	AnnotationVCPUs = AnnotationPrefix + "vcpus"
	// AnnotationMemoryMiB sets the sandbox's guest memory in MiB.
	AnnotationMemoryMiB = AnnotationPrefix + "memory_mib"
	// AnnotationAllowOtherNamespace ("true"/"false") lets a container be
	// restored from a checkpoint made in another containerd namespace.
	AnnotationAllowOtherNamespace = AnnotationPrefix + "checkpoint.allow-other-namespace"
	// AnnotationTemplate sets the template mode of the sandbox: auto,
	// never or required.
	AnnotationTemplate = AnnotationPrefix + "template"
)

// AllowOtherNamespace reads AnnotationAllowOtherNamespace: false when
// absent, an error naming the annotation when it is not a boolean.
func AllowOtherNamespace(annotations map[string]string) (bool, error) {
	v, ok := annotations[AnnotationAllowOtherNamespace]
	if !ok {
		return false, nil
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return false, fmt.Errorf("annotation %s=%q: %w: want true or false", AnnotationAllowOtherNamespace, v, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// ApplyAnnotations overlays the io.cocoon.* annotations on cfg and
// validates the result. Unknown io.cocoon.* keys and malformed values are
// errors naming the key; other annotations are ignored.
func ApplyAnnotations(cfg config.Config, annotations map[string]string) (config.Config, error) {
	keys := make([]string, 0, len(annotations))
	for k := range annotations {
		if strings.HasPrefix(k, AnnotationPrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := annotations[k]
		var err error
		switch k {
		case AnnotationVCPUs:
			cfg.Hypervisor.VCPUs, err = parseInt(v, 1, config.MaxVCPUs)
		case AnnotationMemoryMiB:
			cfg.Hypervisor.MemoryMiB, err = parseInt(v, config.MinMemoryMiB, config.MaxMemoryMiB)
		case AnnotationTemplate:
			switch m := strings.TrimSpace(v); m {
			case config.TemplateAuto, config.TemplateNever, config.TemplateRequired:
				cfg.Template.Mode = m
			default:
				err = fmt.Errorf("want auto, never or required")
			}
		case AnnotationAllowOtherNamespace:
			if _, perr := AllowOtherNamespace(annotations); perr != nil {
				return cfg, perr
			}
		default:
			return cfg, fmt.Errorf("annotation %q: %w: unknown %s annotation (see docs/annotations.md)", k, errdefs.ErrInvalidArgument, AnnotationPrefix)
		}
		if err != nil {
			return cfg, fmt.Errorf("annotation %s=%q: %w: %v", k, v, errdefs.ErrInvalidArgument, err)
		}
	}
	return cfg, cfg.Validate()
}

func parseInt(v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, fmt.Errorf("not an integer")
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("want %d to %d", lo, hi)
	}
	return n, nil
}
