package task

import (
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The topics of containerd's task events (containerd's runtime package).
const (
	TopicCreate      = "/tasks/create"
	TopicStart       = "/tasks/start"
	TopicExecAdded   = "/tasks/exec-added"
	TopicExecStarted = "/tasks/exec-started"
	TopicExit        = "/tasks/exit"
	TopicOOM         = "/tasks/oom"
	TopicDelete      = "/tasks/delete"
	TopicPaused      = "/tasks/paused"
	TopicResumed     = "/tasks/resumed"
)

// exitEvent is the event of p's exit.
func exitEvent(p *process, pid uint32) *eventstypes.TaskExit {
	id := p.execID
	if id == "" {
		id = p.containerID
	}
	return &eventstypes.TaskExit{
		ContainerID: p.containerID,
		ID:          id,
		Pid:         pid,
		ExitStatus:  p.exit.code,
		ExitedAt:    timestamp(p.exit.at),
	}
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
