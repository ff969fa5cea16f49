package task

import (
	"context"
	"fmt"

	eventstypes "github.com/containerd/containerd/api/events"
	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Pause freezes every process of a running container.
func (s *Service) Pause(ctx context.Context, r *taskapi.PauseRequest) (*emptypb.Empty, error) {
	t, err := s.find(r.ID, "", opPause)
	if err != nil {
		return nil, err
	}
	if err := t.sb.PauseContainer(ctx, r.ID); err != nil {
		return nil, fmt.Errorf("pause container %s: %w", r.ID, err)
	}
	s.transition(t.p, stateRunning, statePaused, TopicPaused, &eventstypes.TaskPaused{ContainerID: r.ID})
	return &emptypb.Empty{}, nil
}

// Resume thaws a paused container.
func (s *Service) Resume(ctx context.Context, r *taskapi.ResumeRequest) (*emptypb.Empty, error) {
	t, err := s.find(r.ID, "", opResume)
	if err != nil {
		return nil, err
	}
	if err := t.sb.ResumeContainer(ctx, r.ID); err != nil {
		return nil, fmt.Errorf("resume container %s: %w", r.ID, err)
	}
	s.transition(t.p, statePaused, stateRunning, TopicResumed, &eventstypes.TaskResumed{ContainerID: r.ID})
	return &emptypb.Empty{}, nil
}

// transition moves p from one state to another after the guest did it,
// and publishes the event; if p left from meanwhile (it exited), the
// newer state stands.
func (s *Service) transition(p *process, from, to state, topic string, event proto.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.state != from {
		return
	}
	p.state = to
	s.publish(topic, event)
}

// Update changes a container's resource limits.
func (s *Service) Update(ctx context.Context, r *taskapi.UpdateTaskRequest) (*emptypb.Empty, error) {
	var res specs.LinuxResources
	if err := decodeJSONAny(r.Resources, linuxResourcesURL, &res); err != nil {
		return nil, fmt.Errorf("update container %s: resources: %w", r.ID, err)
	}
	t, err := s.find(r.ID, "", opUpdate)
	if err != nil {
		return nil, err
	}
	if err := t.sb.UpdateContainer(ctx, r.ID, &res); err != nil {
		return nil, fmt.Errorf("update container %s: %w", r.ID, err)
	}
	return &emptypb.Empty{}, nil
}
