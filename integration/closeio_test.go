package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestShimCloseIOAfterEOF drives an exec as containerd's client library
// does, through the Tasks API: its stdin is a fifo the test writes and
// closes, so the exec (cat) reads EOF and exits; CloseIO, which the
// client sends once its copy of stdin ends, succeeds then, and is not
// found once the exec is deleted, as with runc's shim.
func TestShimCloseIOAfterEOF(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, img, _ := shimContainerd(t, v)
			removeAtEnd(t, c, "closeio")
			c.MustCtr("run", "-d", "--runtime", runtimeName, img, "closeio", "sleep", "600")
			c.WaitStatus(t, "closeio", "RUNNING")

			conn, err := grpc.NewClient("unix://"+c.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", c.Namespace)
			api := tasks.NewTasksClient(conn)

			stdin := filepath.Join(t.TempDir(), "stdin")
			if err := unix.Mkfifo(stdin, 0o600); err != nil {
				t.Fatal(err)
			}
			spec, _ := json.Marshal(specs.Process{Args: []string{"cat"}, Cwd: "/", Env: []string{"PATH=/bin"}})
			processURL := "types.containerd.io/opencontainers/runtime-spec/" + strconv.Itoa(specs.VersionMajor) + "/Process"
			if _, err := api.Exec(ctx, &tasks.ExecProcessRequest{ContainerID: "closeio", ExecID: "cat", Stdin: stdin,
				Spec: &anypb.Any{TypeUrl: processURL, Value: spec}}); err != nil {
				t.Fatal(err)
			}
			// The shim opens the fifo's read side; the writer's open waits
			// for it.
			wrote := make(chan error, 1)
			go func() {
				f, err := os.OpenFile(stdin, os.O_WRONLY, 0)
				if err == nil {
					_, err = f.WriteString("to cat\n")
					f.Close()
				}
				wrote <- err
			}()
			if _, err := api.Start(ctx, &tasks.StartRequest{ContainerID: "closeio", ExecID: "cat"}); err != nil {
				t.Fatal(err)
			}
			if err := <-wrote; err != nil {
				t.Fatal(err)
			}
			w, err := api.Wait(ctx, &tasks.WaitRequest{ContainerID: "closeio", ExecID: "cat"})
			if err != nil || w.ExitStatus != 0 {
				t.Fatalf("wait for the exec: %v, %v", w, err)
			}
			if _, err := api.CloseIO(ctx, &tasks.CloseIORequest{ContainerID: "closeio", ExecID: "cat", Stdin: true}); err != nil {
				t.Errorf("CloseIO of an exec whose stdin reached EOF and that exited: %v", err)
			}
			if _, err := api.DeleteProcess(ctx, &tasks.DeleteProcessRequest{ContainerID: "closeio", ExecID: "cat"}); err != nil {
				t.Fatal(err)
			}
			_, err = api.CloseIO(ctx, &tasks.CloseIORequest{ContainerID: "closeio", ExecID: "cat", Stdin: true})
			if !errdefs.IsNotFound(errgrpc.ToNative(err)) {
				t.Errorf("CloseIO of a deleted exec: %v, want not found", err)
			}
			killAndRemove(t, c, "closeio")
		})
	}
}
