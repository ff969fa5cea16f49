package task

import (
	"context"
	"fmt"
	"strings"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	runcopts "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Checkpoint saves the container's whole VM (memory, vCPU and device
// state, scratch disks) into r.Path, which containerd then stores as the
// checkpoint image. containerd pauses the task first and resumes it
// after. With runc's exit option the container ends once saved.
func (s *Service) Checkpoint(ctx context.Context, r *taskapi.CheckpointTaskRequest) (*emptypb.Empty, error) {
	opts, err := checkpointOptions(ctx, r.Options)
	if err != nil {
		return nil, fmt.Errorf("checkpoint container %s: %w", r.ID, err)
	}
	if r.Path == "" {
		return nil, fmt.Errorf("checkpoint container %s: no directory: %w", r.ID, errdefs.ErrInvalidArgument)
	}
	t, err := s.find(r.ID, "", opCheckpoint)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	paused := t.p.state == statePaused
	s.mu.Unlock()
	if err := t.sb.Checkpoint(ctx, CheckpointRequest{
		ContainerID: r.ID,
		Dir:         r.Path,
		Namespace:   s.ns,
		Exit:        opts.Exit,
		Paused:      paused,
	}); err != nil {
		return nil, fmt.Errorf("checkpoint container %s: %w", r.ID, err)
	}
	return &emptypb.Empty{}, nil
}

// checkpointOptions decodes the options containerd sends with a
// checkpoint: runc's CheckpointOptions from containerd 2.x (and from
// clients that pass them), nothing from containerd 1.x's ctr for a
// runtime that is not runc. Options that mean nothing for a VM snapshot
// are named in the log and ignored.
func checkpointOptions(ctx context.Context, a *anypb.Any) (*runcopts.CheckpointOptions, error) {
	opts := &runcopts.CheckpointOptions{}
	if a == nil || len(a.GetValue()) == 0 && a.GetTypeUrl() == "" {
		return opts, nil
	}
	v, err := typeurl.UnmarshalAny(a)
	if err != nil {
		return nil, fmt.Errorf("options of type %q: %w: %v", a.GetTypeUrl(), errdefs.ErrInvalidArgument, err)
	}
	o, ok := v.(*runcopts.CheckpointOptions)
	if !ok {
		return nil, fmt.Errorf("options of type %q: want %s: %w", a.GetTypeUrl(), "containerd.runc.v1.CheckpointOptions", errdefs.ErrInvalidArgument)
	}
	var ignored []string
	if o.OpenTcp {
		ignored = append(ignored, "open_tcp")
	}
	if o.ExternalUnixSockets {
		ignored = append(ignored, "external_unix_sockets")
	}
	if o.Terminal {
		ignored = append(ignored, "terminal")
	}
	if o.FileLocks {
		ignored = append(ignored, "file_locks")
	}
	if len(o.EmptyNamespaces) > 0 {
		ignored = append(ignored, "empty_namespaces")
	}
	if o.CgroupsMode != "" {
		ignored = append(ignored, "cgroups_mode")
	}
	if o.WorkPath != "" {
		ignored = append(ignored, "work_path")
	}
	if o.ParentPath != "" {
		ignored = append(ignored, "parent_path")
	}
	if len(ignored) > 0 {
		log.G(ctx).WithField("options", strings.Join(ignored, ",")).
			Info("checkpoint options for CRIU ignored: a VM snapshot captures every process, socket, lock and terminal as it is")
	}
	return o, nil
}
