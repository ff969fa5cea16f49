package agent

import (
	"errors"
	"strings"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// maxGuestMessage bounds the text of an error the guest answers with,
// which the shim logs and hands on to containerd.
const maxGuestMessage = 1024

// guestStatus is the status the guest answered with, as the host takes
// it: its code, and its message cut to maxGuestMessage. Its details are
// dropped: they would have the host decode types the guest names.
func guestStatus(st *status.Status) error {
	msg := st.Message()
	if len(msg) > maxGuestMessage {
		msg = strings.ToValidUTF8(msg[:maxGuestMessage], "") + " [truncated]"
	}
	return status.New(st.Code(), msg).Err()
}

// malformedReply says whether err is a reply the host could not decode:
// the guest is broken or hostile.
func malformedReply(err error) bool {
	return errors.Is(err, proto.Error) || errors.Is(err, ttrpc.ErrProtocol)
}
