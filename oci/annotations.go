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

	"github.com/cocoonrt/cocoon/guest/execuser"
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
	// AnnotationTemplateSpare ("true"/"false") says whether the sandbox
	// takes its template's spare over and leaves a new one.
	AnnotationTemplateSpare = AnnotationPrefix + "template.spare"
	// AnnotationExecUser is the container's exec user,
	// name:uid:gid[:home[:shell]]; empty turns it off.
	AnnotationExecUser = AnnotationPrefix + "exec-user"
	// AnnotationExecUserSudo ("true"/"false") gives the exec user sudo.
	AnnotationExecUserSudo = AnnotationPrefix + "exec-user.sudo"
	// AnnotationExecUserRequired ("true"/"false") fails the create when
	// the exec user cannot be provisioned.
	AnnotationExecUserRequired = AnnotationPrefix + "exec-user.required"
)

// criContainerType is the annotation with which containerd's CRI marks a
// pod's sandbox (pause) container.
const criContainerType = "io.kubernetes.cri.container-type"

// ExecUserFor is the exec user configuration of a container: base (the
// sandbox's) with the container's own io.cocoon.exec-user* annotations
// over it. A pod's sandbox container, which runs only the pause process,
// gets none.
func ExecUserFor(base config.ExecUser, annotations map[string]string) (config.ExecUser, error) {
	cfg := base
	for _, k := range []string{AnnotationExecUser, AnnotationExecUserSudo, AnnotationExecUserRequired} {
		if v, ok := annotations[k]; ok {
			if err := applyExecUser(&cfg, k, v); err != nil {
				return base, fmt.Errorf("annotation %s=%q: %w: %v", k, v, errdefs.ErrInvalidArgument, err)
			}
		}
	}
	if annotations[criContainerType] == "sandbox" {
		cfg.User = ""
	}
	return cfg, nil
}

// applyExecUser sets the field of cfg that annotation k names.
func applyExecUser(cfg *config.ExecUser, k, v string) error {
	var err error
	switch k {
	case AnnotationExecUser:
		if v != "" {
			_, err = execuser.Parse(v)
		}
		cfg.User = v
	case AnnotationExecUserSudo:
		cfg.Sudo, err = parseBool(v)
	case AnnotationExecUserRequired:
		cfg.Required, err = parseBool(v)
	}
	return err
}

func parseBool(v string) (bool, error) {
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return false, fmt.Errorf("want true or false")
	}
	return b, nil
}

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
		case AnnotationTemplateSpare:
			cfg.Template.Spare, err = strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				err = fmt.Errorf("want true or false")
			}
		case AnnotationExecUser, AnnotationExecUserSudo, AnnotationExecUserRequired:
			err = applyExecUser(&cfg.ExecUser, k, v)
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
