package oci

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/cocoonrt/cocoon/runtime/config"
)

func TestApplyAnnotations(t *testing.T) {
	cases := []struct {
		name    string
		in      map[string]string
		vcpus   int
		mem     int
		wantErr string
	}{
		{name: "none", in: nil, vcpus: 1, mem: 256},
		{name: "foreign keys ignored", in: map[string]string{"io.kubernetes.cri.sandbox-id": "x"}, vcpus: 1, mem: 256},
		{name: "both", in: map[string]string{AnnotationVCPUs: "2", AnnotationMemoryMiB: "512"}, vcpus: 2, mem: 512},
		{name: "unknown key", in: map[string]string{"io.cocoon.vcpu": "2"}, wantErr: `"io.cocoon.vcpu"`},
		{name: "not a number", in: map[string]string{AnnotationVCPUs: "two"}, wantErr: "io.cocoon.vcpus"},
		{name: "too many vcpus", in: map[string]string{AnnotationVCPUs: "65"}, wantErr: "want 1 to 64"},
		{name: "too little memory", in: map[string]string{AnnotationMemoryMiB: "16"}, wantErr: "io.cocoon.memory_mib"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ApplyAnnotations(config.Default(), tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err = %v, want an invalid-argument error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Hypervisor.VCPUs != tc.vcpus || got.Hypervisor.MemoryMiB != tc.mem {
				t.Fatalf("got %d vcpus %d MiB, want %d and %d", got.Hypervisor.VCPUs, got.Hypervisor.MemoryMiB, tc.vcpus, tc.mem)
			}
		})
	}
}

func TestAllowOtherNamespace(t *testing.T) {
	for _, tc := range []struct {
		v     string
		set   bool
		want  bool
		isErr bool
	}{{set: false}, {v: "true", set: true, want: true}, {v: "false", set: true}, {v: "yes please", set: true, isErr: true}} {
		a := map[string]string{}
		if tc.set {
			a[AnnotationAllowOtherNamespace] = tc.v
		}
		got, err := AllowOtherNamespace(a)
		if (err != nil) != tc.isErr || got != tc.want {
			t.Errorf("%q: got %v, %v", tc.v, got, err)
		}
		if _, err := ApplyAnnotations(config.Default(), a); (err != nil) != tc.isErr {
			t.Errorf("ApplyAnnotations %q: %v", tc.v, err)
		}
	}
}

func TestExecUserAnnotations(t *testing.T) {
	base := config.Default().ExecUser
	base.User = "ops:5000:5000"
	cases := []struct {
		name     string
		in       map[string]string
		user     string
		sudo     bool
		required bool
		wantErr  string
	}{
		{name: "the sandbox's", in: nil, user: "ops:5000:5000"},
		{name: "the container's over it", in: map[string]string{AnnotationExecUser: "dev:4242:4242::/bin/bash", AnnotationExecUserSudo: "true", AnnotationExecUserRequired: "1"},
			user: "dev:4242:4242::/bin/bash", sudo: true, required: true},
		{name: "empty turns it off", in: map[string]string{AnnotationExecUser: ""}, user: ""},
		{name: "a pod's sandbox container has none", in: map[string]string{criContainerType: "sandbox"}, user: ""},
		{name: "a pod's app container has it", in: map[string]string{criContainerType: "container"}, user: "ops:5000:5000"},
		{name: "not a number", in: map[string]string{AnnotationExecUser: "dev:x:4242"}, wantErr: `uid "x"`},
		{name: "leading dash", in: map[string]string{AnnotationExecUser: "-dev:4242:4242"}, wantErr: AnnotationExecUser},
		{name: "relative home", in: map[string]string{AnnotationExecUser: "dev:4242:4242:home/dev"}, wantErr: "home"},
		{name: "uid 0 not root", in: map[string]string{AnnotationExecUser: "dev:0:0"}, wantErr: "root"},
		{name: "sudo not a boolean", in: map[string]string{AnnotationExecUserSudo: "yes please"}, wantErr: AnnotationExecUserSudo},
		{name: "required not a boolean", in: map[string]string{AnnotationExecUserRequired: "maybe"}, wantErr: AnnotationExecUserRequired},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ExecUserFor(base, tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err = %v, want an invalid-argument error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.User != tc.user || got.Sudo != tc.sudo || got.Required != tc.required {
				t.Errorf("got user %q sudo %v required %v, want %q %v %v", got.User, got.Sudo, got.Required, tc.user, tc.sudo, tc.required)
			}
		})
	}
	// The sandbox's annotations go through ApplyAnnotations, which
	// validates them the same way.
	if _, err := ApplyAnnotations(config.Default(), map[string]string{AnnotationExecUser: "a:b:c"}); err == nil || !strings.Contains(err.Error(), AnnotationExecUser) {
		t.Errorf("ApplyAnnotations with a malformed exec user: %v", err)
	}
	cfg, err := ApplyAnnotations(config.Default(), map[string]string{AnnotationExecUser: "dev:4242:4242", AnnotationExecUserSudo: "true"})
	if err != nil || cfg.ExecUser.User != "dev:4242:4242" || !cfg.ExecUser.Sudo {
		t.Errorf("ApplyAnnotations: %+v, %v", cfg.ExecUser, err)
	}
}

func TestTemplateSpareAnnotation(t *testing.T) {
	if !config.Default().Template.Spare {
		t.Fatal("template.spare is off by default")
	}
	for _, tc := range []struct {
		v     string
		want  bool
		isErr bool
	}{{v: "false"}, {v: " true ", want: true}, {v: "0"}, {v: "sometimes", isErr: true}} {
		got, err := ApplyAnnotations(config.Default(), map[string]string{AnnotationTemplateSpare: tc.v})
		if tc.isErr {
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), AnnotationTemplateSpare) {
				t.Errorf("%q: err = %v, want an invalid argument naming the annotation", tc.v, err)
			}
			continue
		}
		if err != nil || got.Template.Spare != tc.want {
			t.Errorf("%q: spare %v, err %v; want %v", tc.v, got.Template.Spare, err, tc.want)
		}
	}
}
