package task

import (
	"fmt"

	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
)

// state is where a process (a container's init or an exec) is in its
// lifecycle. starting is the shim's own: Start is in flight, and containerd
// sees created.
//
//	created ──start──▶ starting ──▶ running ◀──resume── paused
//	   │                  │            │ └────pause─────▶ │
//	   │                  └────────────┴──exit──▶ stopped ◀┘
//	   └──────────────────exit / delete──────────▶ │
//	                                       deleted ◀┘
type state uint8

const (
	stateCreated state = iota
	stateStarting
	stateRunning
	statePaused
	stateStopped
	stateDeleted
)

func (s state) String() string {
	switch s {
	case stateCreated:
		return "created"
	case stateStarting:
		return "starting"
	case stateRunning:
		return "running"
	case statePaused:
		return "paused"
	case stateStopped:
		return "stopped"
	case stateDeleted:
		return "deleted"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// status is what containerd is told.
func (s state) status() tasktypes.Status {
	switch s {
	case stateCreated, stateStarting:
		return tasktypes.Status_CREATED
	case stateRunning:
		return tasktypes.Status_RUNNING
	case statePaused:
		return tasktypes.Status_PAUSED
	case stateStopped, stateDeleted:
		return tasktypes.Status_STOPPED
	}
	return tasktypes.Status_UNKNOWN
}

// op is something done to a process.
type op string

const (
	opStart      op = "start"
	opPause      op = "pause"
	opResume     op = "resume"
	opKill       op = "signal"
	opDelete     op = "delete"
	opResize     op = "resize the terminal of"
	opCloseIO    op = "close the stdin of"
	opUpdate     op = "update"
	opExec       op = "exec in"
	opExit       op = "record the exit of"
	opCheckpoint op = "checkpoint"
)

// allowed lists the states each op may be done in.
var allowed = map[op][]state{
	opStart:      {stateCreated},
	opPause:      {stateRunning},
	opResume:     {statePaused},
	opKill:       {stateCreated, stateStarting, stateRunning, statePaused},
	opDelete:     {stateCreated, stateStopped},
	opResize:     {stateCreated, stateStarting, stateRunning, statePaused},
	opCloseIO:    {stateCreated, stateStarting, stateRunning, statePaused, stateStopped},
	opUpdate:     {stateCreated, stateRunning, statePaused},
	opExec:       {stateRunning},
	opExit:       {stateCreated, stateStarting, stateRunning, statePaused},
	opCheckpoint: {stateRunning, statePaused},
}

// check returns nil if o may be done to the process named what in state
// s, else an errdefs error with a sentence saying why not.
func (s state) check(o op, what string) error {
	for _, ok := range allowed[o] {
		if s == ok {
			return nil
		}
	}
	switch {
	case s == stateDeleted:
		return fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
	case s == stateStopped && o == opKill:
		// containerd and CRI take NotFound as "already gone".
		return fmt.Errorf("cannot %s %s: process already finished: %w", o, what, errdefs.ErrNotFound)
	case o == opDelete:
		return fmt.Errorf("cannot delete %s: it is %s; kill it and wait for it to exit first: %w", what, s, errdefs.ErrFailedPrecondition)
	}
	return fmt.Errorf("cannot %s %s: it is %s: %w", o, what, s, errdefs.ErrFailedPrecondition)
}
