package manager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/shim/events"
	"github.com/cocoonrt/cocoon/shim/task"
	"github.com/cocoonrt/cocoon/shim/vm"
)

// How long the way out may take: stopping the VM (the sandbox escalates
// to SIGKILL within its own stop timeout), delivering the last events,
// finishing the calls in flight.
const (
	stopTimeout     = 30 * time.Second
	flushTimeout    = 5 * time.Second
	shutdownTimeout = 2 * time.Second
)

// listenFD is the fd start passes the listening socket on.
const listenFD = 3

// serve is the shim server: the Task service on the socket start made,
// until containerd's Shutdown (no container left), SIGTERM or SIGINT.
// Then the VM is stopped, the last events are delivered and the socket is
// removed.
func serve(ctx context.Context, f flags, env Env) error {
	ctx, logFile := serverLog(ctx, f.debug)
	defer logFile.Close()
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("pid", os.Getpid()))
	// stderr is containerd's log fifo: a write to it after containerd
	// went away must fail (EPIPE), not kill the shim. Notify rather than
	// Ignore, so that QEMU and logging binaries start with the default
	// disposition; the channel is never read and Notify never blocks.
	signal.Notify(make(chan os.Signal, 1), unix.SIGPIPE)
	l, address, err := serverListener(f)
	if err != nil {
		return err
	}
	defer removeSocket(address)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)
	defer signal.Stop(sigs)

	publisher := events.NewPublisher(ctx, env.Getenv("TTRPC_ADDRESS"), f.namespace)
	svc := task.New(task.Options{
		Namespace: f.namespace,
		Launcher:  vm.Launcher{Getenv: env.Getenv},
		Publisher: publisher,
		Shutdown:  cancel,
	})
	server, err := ttrpc.NewServer(
		ttrpc.WithServerHandshaker(ttrpc.UnixSocketRequireSameUser()),
		ttrpc.WithUnaryServerInterceptor(task.Interceptor),
	)
	if err != nil {
		return err
	}
	task.Register(server, svc)
	served := make(chan error, 1)
	go func() { served <- server.Serve(ctx, l) }()
	log.G(ctx).WithField("address", address).Info("shim serving")

	select {
	case <-ctx.Done():
		log.G(ctx).Info("shutdown requested: no container left")
	case s := <-sigs:
		log.G(ctx).WithField("signal", s.String()).Info("shutting down on signal")
	case err := <-served:
		log.G(ctx).WithError(err).Error("ttrpc server failed")
	}
	return shutdown(context.WithoutCancel(ctx), svc, publisher, server)
}

// shutdown stops the VM (so every process exits and Wait calls return),
// delivers the events that produced, then lets the calls in flight (the
// Shutdown call itself) finish.
func shutdown(ctx context.Context, svc *task.Service, publisher *events.Publisher, server *ttrpc.Server) error {
	var errs []error
	sctx, cancel := context.WithTimeout(ctx, stopTimeout)
	errs = append(errs, svc.Close(sctx))
	cancel()
	fctx, cancel := context.WithTimeout(ctx, flushTimeout)
	errs = append(errs, publisher.Close(fctx))
	cancel()
	dctx, cancel := context.WithTimeout(ctx, shutdownTimeout)
	if err := server.Shutdown(dctx); err != nil {
		_ = server.Close()
	}
	cancel()
	err := errors.Join(errs...)
	if err != nil {
		log.G(ctx).WithError(err).Error("shim shutdown")
	} else {
		log.G(ctx).Info("shim exiting")
	}
	return err
}

// serverListener is the socket to serve: fd 3 from start, or -socket.
func serverListener(f flags) (net.Listener, string, error) {
	if f.socket != "" {
		address := "unix://" + f.socket
		l, err := listen(address)
		return l, address, err
	}
	file := os.NewFile(listenFD, "shim-socket")
	l, err := net.FileListener(file)
	file.Close()
	if err != nil {
		return nil, "", fmt.Errorf("listen on fd %d from start: %w", listenFD, err)
	}
	address := ""
	if a, ok := l.Addr().(*net.UnixAddr); ok && a.Name != "" {
		address = "unix://" + a.Name
	}
	return l, address, nil
}
