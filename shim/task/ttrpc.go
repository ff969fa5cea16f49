package task

import (
	"context"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"
)

// The names containerd calls the Task service by: v2 from containerd 1.6
// and 1.7 (and 2.x talking to a shim that answered bootstrap version 2),
// v3 from containerd 2.x.
const (
	ServiceV2 = "containerd.task.v2.Task"
	ServiceV3 = "containerd.task.v3.Task"
)

var _ taskapi.TTRPCTaskService = (*Service)(nil)

// Register serves s on server under both Task service names.
//
// One ServiceDesc, decoding into the v3 request types, serves both. That is
// safe because task v3 is task v2 renamed: api/runtime/task/v3/shim.proto
// differs from v2's only in its package line (the Go package and the ttrpc
// service name), so every request and response has the same fields with
// the same numbers and types, and the protobuf wire bytes are identical.
// The unit tests hold the two packages to that (TestV2V3WireIdentical) and
// call the service through the generated v2 client.
func Register(server *ttrpc.Server, s taskapi.TTRPCTaskService) {
	desc := serviceDesc(s)
	server.RegisterService(ServiceV2, desc)
	server.RegisterService(ServiceV3, desc)
}

func serviceDesc(s taskapi.TTRPCTaskService) *ttrpc.ServiceDesc {
	return &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		"State":      method(s.State),
		"Create":     method(s.Create),
		"Start":      method(s.Start),
		"Delete":     method(s.Delete),
		"Pids":       method(s.Pids),
		"Pause":      method(s.Pause),
		"Resume":     method(s.Resume),
		"Checkpoint": method(s.Checkpoint),
		"Kill":       method(s.Kill),
		"Exec":       method(s.Exec),
		"ResizePty":  method(s.ResizePty),
		"CloseIO":    method(s.CloseIO),
		"Update":     method(s.Update),
		"Wait":       method(s.Wait),
		"Stats":      method(s.Stats),
		"Connect":    method(s.Connect),
		"Shutdown":   method(s.Shutdown),
	}}
}

// method adapts one typed RPC to ttrpc: decode the request, call.
func method[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](call func(context.Context, PReq) (Resp, error)) ttrpc.Method {
	return func(ctx context.Context, unmarshal func(any) error) (any, error) {
		req := PReq(new(Req))
		if err := unmarshal(req); err != nil {
			return nil, err
		}
		return call(ctx, req)
	}
}

// Interceptor is the one place errors become gRPC status codes (errgrpc),
// and where every call is logged.
func Interceptor(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, m ttrpc.Method) (any, error) {
	start := time.Now()
	resp, err := m(ctx, unmarshal)
	lg := log.G(ctx).WithField("method", info.FullMethod).WithField("duration_ms", time.Since(start).Milliseconds())
	if err != nil {
		// What containerd asks in the normal course (delete twice, kill
		// a finished process) is no news; anything else is.
		if errdefs.IsNotFound(err) || errdefs.IsAlreadyExists(err) || errdefs.IsFailedPrecondition(err) || errdefs.IsNotImplemented(err) {
			lg.WithError(err).Debug("task call failed")
		} else {
			lg.WithError(err).Warn("task call failed")
		}
		return nil, errgrpc.ToGRPC(err)
	}
	lg.Trace("task call")
	return resp, nil
}
