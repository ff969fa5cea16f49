package initd

import (
	"fmt"
	"strings"
)

// Channel kinds the kernel command line may name for the agent session.
const (
	ChannelSerial = "serial"
	ChannelVsock  = "vsock"
)

// Kernel command line keys that cocoon-agent reads.
const (
	// CmdlineChannel selects the agent channel: vsock or serial (default).
	CmdlineChannel = "cocoon.channel"
	// CmdlineDebug turns on debug logging when 1 (or present alone).
	CmdlineDebug = "cocoon.debug"
)

// Cmdline is what the kernel command line tells the agent.
type Cmdline struct {
	// Channel is ChannelSerial or ChannelVsock.
	Channel string
	// Debug turns on debug logging.
	Debug bool
}

// ParseCmdline reads the agent's keys from a kernel command line
// (/proc/cmdline). Other keys are ignored. An invalid value leaves the
// default in place and is reported in the error, so the agent can still
// come up and say what was wrong.
func ParseCmdline(s string) (Cmdline, error) {
	c := Cmdline{Channel: ChannelSerial}
	var errs []string
	for _, f := range strings.Fields(s) {
		key, val, hasVal := strings.Cut(f, "=")
		switch key {
		case CmdlineChannel:
			switch val {
			case ChannelSerial, ChannelVsock:
				c.Channel = val
			default:
				errs = append(errs, fmt.Sprintf("%s=%q: want %s or %s", key, val, ChannelVsock, ChannelSerial))
			}
		case CmdlineDebug:
			switch {
			case !hasVal || val == "1" || val == "true" || val == "yes":
				c.Debug = true
			case val == "0" || val == "false" || val == "no":
				c.Debug = false
			default:
				errs = append(errs, fmt.Sprintf("%s=%q: want 1 or 0", key, val))
			}
		}
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("kernel command line: %s", strings.Join(errs, "; "))
	}
	return c, nil
}
