// Command cocoon-agent is the guest agent: PID 1 of every Cocoon microVM.
// As PID 1 it does the init duties (guest/initd) and serves the agent
// session on the channel the kernel command line names. Started as an
// ordinary process (tests, debugging) it serves sessions on --listen.
//
// Build it static: CGO_ENABLED=0 go build ./cmd/cocoon-agent
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/log"
	"github.com/mdlayher/vsock"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/reaper"
	"github.com/cocoonrt/cocoon/guest/initd"
	"github.com/cocoonrt/cocoon/runtime/channel"
)

func main() {
	ctx := context.Background()
	if os.Getpid() == 1 {
		fatal(runInit(ctx))
	}
	if err := runStandalone(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "cocoon-agent:", err)
		os.Exit(1)
	}
}

// runInit is PID 1: init duties, then the agent session. It returns only
// on a fatal error.
func runInit(ctx context.Context) error {
	// The console is a terminal, so logrus would colour its lines; the
	// host reads them as plain text (console.log, error tails).
	log.L.Logger.SetFormatter(&logrus.TextFormatter{DisableColors: true, FullTimestamp: true, TimestampFormat: time.RFC3339Nano})
	rep, err := initd.Run(ctx)
	if rep.Cmdline.Debug {
		_ = log.SetLevel("debug")
	}
	for _, s := range rep.Steps {
		log.G(ctx).WithField("step", s.Name).WithField("duration", s.Duration).Debug("init step")
	}
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	log.G(ctx).WithField("init", rep.Total).WithField("channel", rep.Cmdline.Channel).WithField("version", agent.Version).Info("cocoon-agent up")

	r := reaper.New(reaper.Options{Orphans: true})
	svc, err := agent.New(agent.Config{
		System:       agent.LinuxSystem{Halt: initd.PowerOff},
		Reaper:       r,
		InitDuration: rep.Total,
	})
	if err != nil {
		return err
	}
	if rep.Cmdline.Channel == initd.ChannelVsock {
		return svc.ServeVsock(ctx, channel.VsockPort)
	}
	return svc.ServeSerial(ctx, channel.SerialPortName)
}

// fatal reports err on the console, where the host's error message quotes
// the console tail, and powers off: PID 1 returning would panic the kernel.
func fatal(err error) {
	if err == nil {
		err = errors.New("agent stopped serving")
	}
	msg := fmt.Sprintf("cocoon-agent: fatal: %v\n", err)
	if f, oerr := os.OpenFile("/dev/console", os.O_WRONLY|unix.O_NOCTTY, 0); oerr == nil {
		_, _ = f.WriteString(msg)
		_ = f.Close()
	} else {
		_, _ = os.Stderr.WriteString(msg)
	}
	if perr := initd.PowerOff(); perr != nil {
		_, _ = os.Stderr.WriteString("cocoon-agent: " + perr.Error() + "\n")
	}
	// Nothing else can end the VM; exiting panics the kernel, which a
	// panic=-1 command line turns into a reset.
	os.Exit(1)
}

// runStandalone serves agent sessions for tests and debugging.
func runStandalone(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cocoon-agent", flag.ContinueOnError)
	listen := fs.String("listen", "", "serve sessions on `ADDR`: unix:/path or vsock:PORT")
	debug := fs.Bool("debug", false, "log at debug level")
	subreaper := fs.Bool("subreaper", false, "become a child subreaper and reap orphans, as PID 1 does")
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		fmt.Println(agent.Version)
		return nil
	}
	if *debug {
		_ = log.SetLevel("debug")
	}
	if *listen == "" {
		return errors.New("not PID 1: --listen is required")
	}
	l, err := listenOn(*listen)
	if err != nil {
		return err
	}
	if *subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("become subreaper: %w", err)
		}
	}
	r := reaper.New(reaper.Options{Orphans: *subreaper})
	defer r.Close()
	svc, err := agent.New(agent.Config{
		System: agent.LinuxSystem{Halt: func() error { return errors.New("not PID 1: refusing to power off") }},
		Reaper: r,
	})
	if err != nil {
		return err
	}
	log.G(ctx).WithField("listen", *listen).Info("cocoon-agent serving")
	return svc.ServeListener(ctx, l)
}

func listenOn(addr string) (net.Listener, error) {
	kind, rest, _ := strings.Cut(addr, ":")
	switch kind {
	case "unix":
		_ = os.Remove(rest)
		return net.Listen("unix", rest)
	case "vsock":
		port, err := strconv.ParseUint(rest, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("vsock port %q: %w", rest, err)
		}
		return vsock.Listen(uint32(port), nil)
	}
	return nil, fmt.Errorf("listen address %q: want unix:/path or vsock:PORT", addr)
}
