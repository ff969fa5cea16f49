package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
)

// linuxResourcesURL is the type URL containerd's client gives the
// JSON-encoded LinuxResources of an update.
var linuxResourcesURL = "types.containerd.io/opencontainers/runtime-spec/" + strconv.Itoa(specs.VersionMajor) + "/LinuxResources"

// UpdateTask changes the resources of task id as containerd's Go client
// does (ctr has no command for it): the Tasks service's Update, with the
// resources as JSON in an Any.
func (c *Containerd) UpdateTask(ctx context.Context, id string, res *specs.LinuxResources) error {
	data, err := json.Marshal(res)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+c.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", c.Namespace)
	_, err = tasks.NewTasksClient(conn).Update(ctx, &tasks.UpdateTaskRequest{
		ContainerID: id,
		Resources:   &anypb.Any{TypeUrl: linuxResourcesURL, Value: data},
	})
	if err != nil {
		return fmt.Errorf("update task %s: %w", id, err)
	}
	return nil
}
