package task

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"testing"

	taskv2 "github.com/containerd/containerd/api/runtime/task/v2"
	taskv3 "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// serve serves svc over ttrpc on a unix socket, as the shim does, and
// returns a client connection.
func serve(t *testing.T, svc taskv3.TTRPCTaskService) *ttrpc.Client {
	t.Helper()
	server, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(Interceptor))
	if err != nil {
		t.Fatal(err)
	}
	Register(server, svc)
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go server.Serve(context.Background(), l)
	t.Cleanup(func() { server.Close() })
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c := ttrpc.NewClient(conn)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestServedAsV2AndV3 drives the service through containerd's generated
// v2 client (containerd 1.6, 1.7) and v3 client (2.x), and checks that
// errors arrive as gRPC codes containerd maps back.
func TestServedAsV2AndV3(t *testing.T) {
	ts := newTestService(t)
	conn := serve(t, ts.svc)
	ctx := context.Background()
	v2 := taskv2.NewTTRPCTaskClient(conn)
	v3 := taskv3.NewTTRPCTaskClient(conn)

	created, err := v2.Create(ctx, &taskv2.CreateTaskRequest{ID: "c1", Bundle: ts.bundle(nil)})
	if err != nil {
		t.Fatalf("v2 create: %v", err)
	}
	if created.Pid != fakeHostPID {
		t.Errorf("v2 create pid %d", created.Pid)
	}
	if _, err := v3.Start(ctx, &taskv3.StartRequest{ID: "c1"}); err != nil {
		t.Fatalf("v3 start: %v", err)
	}
	st2, err := v2.State(ctx, &taskv2.StateRequest{ID: "c1"})
	if err != nil || st2.Status.String() != "RUNNING" || st2.ID != "c1" {
		t.Errorf("v2 state = %v, %v", st2, err)
	}
	st3, err := v3.State(ctx, &taskv3.StateRequest{ID: "c1"})
	if err != nil || st3.Status.String() != "RUNNING" || st3.Bundle != st2.Bundle {
		t.Errorf("v3 state = %v, %v", st3, err)
	}

	_, err = v2.State(ctx, &taskv2.StateRequest{ID: "nope"})
	if status.Code(err) != codes.NotFound || !errdefs.IsNotFound(errgrpc.ToNative(err)) {
		t.Errorf("v2 state of unknown: %v, want NotFound", err)
	}
	if _, err = v3.Checkpoint(ctx, &taskv3.CheckpointTaskRequest{ID: "c1", Path: "/tmp/v3"}); err != nil {
		t.Errorf("v3 checkpoint: %v", err)
	}
	if _, err = v2.Checkpoint(ctx, &taskv2.CheckpointTaskRequest{ID: "c1", Path: "/tmp/v2"}); err != nil {
		t.Errorf("v2 checkpoint: %v", err)
	}
	_, err = v2.Checkpoint(ctx, &taskv2.CheckpointTaskRequest{ID: "nope", Path: "/tmp/v2"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("v2 checkpoint of unknown: %v, want NotFound", err)
	}
	_, err = v2.Start(ctx, &taskv2.StartRequest{ID: "c1"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("v2 second start: %v, want FailedPrecondition", err)
	}
}

// TestV2V3WireIdentical holds the claim Register relies on: every message
// of task v3 has a v2 twin with the same fields (numbers, kinds,
// cardinality, message types), so their wire bytes are interchangeable.
func TestV2V3WireIdentical(t *testing.T) {
	v2 := taskv2.File_runtime_task_v2_shim_proto
	v3 := taskv3.File_runtime_task_v3_shim_proto
	if v2.Messages().Len() != v3.Messages().Len() {
		t.Fatalf("v2 has %d messages, v3 %d", v2.Messages().Len(), v3.Messages().Len())
	}
	for i := 0; i < v3.Messages().Len(); i++ {
		m3 := v3.Messages().Get(i)
		m2 := v2.Messages().ByName(m3.Name())
		if m2 == nil {
			t.Errorf("v3 %s has no v2 twin", m3.Name())
			continue
		}
		sameFields(t, m2, m3)
	}
	s2, s3 := v2.Services().Get(0), v3.Services().Get(0)
	for i := 0; i < s3.Methods().Len(); i++ {
		m3 := s3.Methods().Get(i)
		m2 := s2.Methods().ByName(m3.Name())
		if m2 == nil || m2.Input().Name() != m3.Input().Name() || m2.Output().Name() != m3.Output().Name() {
			t.Errorf("method %s differs between v2 and v3", m3.Name())
		}
	}
	if s2.Methods().Len() != s3.Methods().Len() {
		t.Errorf("v2 has %d methods, v3 %d", s2.Methods().Len(), s3.Methods().Len())
	}
}

// TestV2V3Bytes round-trips a full request through both packages.
func TestV2V3Bytes(t *testing.T) {
	in := &taskv3.CreateTaskRequest{
		ID: "c", Bundle: "/b", Terminal: true, Stdin: "/i", Stdout: "/o", Stderr: "/e",
		Rootfs:  []*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/l"}}},
		Options: &anypb.Any{TypeUrl: "x", Value: []byte{1, 2}},
	}
	opts := proto.MarshalOptions{Deterministic: true}
	b3, err := opts.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var mid taskv2.CreateTaskRequest
	if err := proto.Unmarshal(b3, &mid); err != nil {
		t.Fatal(err)
	}
	b2, err := opts.Marshal(&mid)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b2, b3) || mid.Rootfs[0].Options[0] != "lowerdir=/l" || !mid.Terminal {
		t.Errorf("v3 -> v2 -> bytes differ: %x vs %x", b2, b3)
	}
}

func sameFields(t *testing.T, m2, m3 protoreflect.MessageDescriptor) {
	t.Helper()
	if m2.Fields().Len() != m3.Fields().Len() {
		t.Errorf("%s: %d fields in v2, %d in v3", m3.Name(), m2.Fields().Len(), m3.Fields().Len())
		return
	}
	for j := 0; j < m3.Fields().Len(); j++ {
		f3 := m3.Fields().Get(j)
		f2 := m2.Fields().ByNumber(f3.Number())
		switch {
		case f2 == nil:
			t.Errorf("%s.%s: no field %d in v2", m3.Name(), f3.Name(), f3.Number())
		case f2.Kind() != f3.Kind() || f2.Cardinality() != f3.Cardinality() || f2.IsPacked() != f3.IsPacked():
			t.Errorf("%s.%s: encoded differently in v2 and v3", m3.Name(), f3.Name())
		case f3.Message() != nil && f2.Message().FullName() != f3.Message().FullName():
			// Fields of this file's own types are checked as messages.
			if f2.Message().Name() != f3.Message().Name() {
				t.Errorf("%s.%s: type %s in v2, %s in v3", m3.Name(), f3.Name(), f2.Message().FullName(), f3.Message().FullName())
			}
		}
	}
}
