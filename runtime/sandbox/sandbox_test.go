package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	guestagent "github.com/cocoonrt/cocoon/guest/agent"
	"github.com/cocoonrt/cocoon/guest/agent/reaper"
	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
	"github.com/cocoonrt/cocoon/runtime/image"
)

// guestMode says how the fake guest behaves.
type guestMode int

const (
	guestServes guestMode = iota // the agent answers
	guestSilent                  // the channel accepts but nothing answers
	guestDies                    // the VMM exits during boot
)

// fakeDriver launches fake VMs whose "guest" is an in-process agent
// serving the agent socket in the state dir.
type fakeDriver struct {
	mode guestMode
	// launched records every VM, to check they were stopped.
	mu       sync.Mutex // guards launched
	launched []*fakeVM
}

func (d *fakeDriver) Name() string { return "fake" }

func (d *fakeDriver) Launch(ctx context.Context, spec hypervisor.Spec) (hypervisor.VM, error) {
	sock := filepath.Join(spec.StateDir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	vm := &fakeVM{sock: sock, exited: make(chan struct{}), l: l}
	d.mu.Lock()
	d.launched = append(d.launched, vm)
	d.mu.Unlock()
	gctx, cancel := context.WithCancel(context.Background())
	vm.cancel = cancel
	switch d.mode {
	case guestServes:
		r := reaper.New(reaper.Options{})
		svc, err := guestagent.New(guestagent.Config{System: &fakeSystem{vm: vm}, Reaper: r})
		if err != nil {
			return nil, err
		}
		rl := &recordingListener{Listener: l, vm: vm}
		go func() { svc.ServeListener(gctx, rl); r.Close() }()
	case guestSilent:
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
	case guestDies:
		go func() {
			time.Sleep(50 * time.Millisecond)
			vm.exit(errors.New("qemu exited with status 1"))
		}()
	}
	return vm, nil
}

type fakeVM struct {
	sock   string
	l      net.Listener
	cancel context.CancelFunc

	mu sync.Mutex // guards conns
	// conns are the guest's ends of the agent connections.
	conns []net.Conn

	once    sync.Once // closes exited
	exited  chan struct{}
	exitErr error
	stopped bool
}

func (v *fakeVM) exit(err error) {
	v.once.Do(func() {
		v.exitErr = err
		v.cancel()
		v.l.Close()
		close(v.exited)
	})
}

// recordingListener keeps the guest's end of each agent connection, for
// tests that make the guest misbehave.
type recordingListener struct {
	net.Listener
	vm *fakeVM
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.vm.mu.Lock()
		l.vm.conns = append(l.vm.conns, c)
		l.vm.mu.Unlock()
	}
	return c, err
}

// sendGarbage writes bytes that are no yamux frame on the guest's end of
// the agent connection, as a broken or hostile guest would.
func (v *fakeVM) sendGarbage() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.conns) == 0 {
		return errors.New("no agent connection")
	}
	_, err := v.conns[len(v.conns)-1].Write([]byte("\xff\xffnot a yamux frame, not ttrpc either\n"))
	return err
}

func (v *fakeVM) PID() int { return os.Getpid() }
func (v *fakeVM) AgentEndpoint() channel.Endpoint {
	return channel.Endpoint{Kind: channel.Serial, SocketPath: v.sock}
}
func (v *fakeVM) Exited() <-chan struct{} { return v.exited }
func (v *fakeVM) ExitError() error        { return v.exitErr }
func (v *fakeVM) ConsoleTail(n int) []string {
	return []string{"[    0.1] fake kernel booting", "[    0.2] last words"}
}
func (v *fakeVM) Stop(ctx context.Context) error {
	v.exit(nil)
	v.stopped = true
	os.Remove(v.sock)
	return nil
}

// fakeSystem powers the fake VM off.
type fakeSystem struct{ vm *fakeVM }

func (fakeSystem) SetWallClock(time.Time) error { return nil }
func (fakeSystem) AddEntropy([]byte) error      { return nil }
func (fakeSystem) SetHostname(string) error     { return nil }
func (s *fakeSystem) PowerOff() error {
	go s.vm.exit(nil)
	return nil
}

func testOptions(t *testing.T, d *fakeDriver) Options {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	os.Mkdir(img, 0o755)
	m := image.Manifest{Schema: 1}
	for _, f := range []*image.File{&m.Kernel.File, &m.Initrd} {
		name := "vmlinux"
		if f == &m.Initrd {
			name = "initrd.img"
		}
		os.WriteFile(filepath.Join(img, name), []byte(name), 0o644)
		sum := sha256.Sum256([]byte(name))
		f.Path, f.SHA256 = name, hex.EncodeToString(sum[:])
	}
	b, _ := json.Marshal(m)
	os.WriteFile(filepath.Join(img, image.ManifestName), b, 0o644)
	im, err := image.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Runtime.StateDir = filepath.Join(dir, "run")
	cfg.Runtime.DataDir = filepath.Join(dir, "lib")
	cfg.Runtime.StartTimeout.Duration = 3 * time.Second
	cfg.Runtime.StopTimeout.Duration = 2 * time.Second
	return Options{
		Namespace: "test", ID: "sb1", Config: cfg, Driver: d, Image: im,
		AccelHost:   hypervisor.AccelHost{},
		ChannelHost: channel.Host{VhostVsock: func() error { return os.ErrNotExist }},
	}
}

func TestStartAndStop(t *testing.T) {
	d := &fakeDriver{mode: guestServes}
	o := testOptions(t, d)
	sb, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Accel != hypervisor.AccelTCG || sb.Channel != channel.Serial || sb.ReadyIn <= 0 || sb.Guest.Version == "" {
		t.Fatalf("sandbox facts: %+v", sb)
	}
	st, err := ReadState(sb.Dir)
	if err != nil || st.ID != "sb1" || st.Namespace != "test" || st.Driver != "fake" {
		t.Fatalf("state record %+v, %v", st, err)
	}
	if _, err := Start(context.Background(), o); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second start with the same id: %v, want already exists", err)
	}
	if err := sb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := sb.Stop(context.Background()); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	if _, err := os.Stat(sb.Dir); !os.IsNotExist(err) {
		t.Fatalf("state dir left: %v", err)
	}
	if !d.launched[0].stopped {
		t.Fatal("vm not stopped")
	}
}

func TestStartFailures(t *testing.T) {
	cases := []struct {
		name string
		mode guestMode
		want []string
	}{
		{"guest never answers", guestSilent, []string{"not ready", "deadline", "last words"}},
		{"vmm exits during boot", guestDies, []string{"vm exited before the agent was ready", "status 1", "last words"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := &fakeDriver{mode: tc.mode}
			o := testOptions(t, d)
			o.Config.Runtime.StartTimeout.Duration = 700 * time.Millisecond
			start := time.Now()
			_, err := Start(context.Background(), o)
			if err == nil {
				t.Fatal("start succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if tc.mode == guestDies && time.Since(start) > 600*time.Millisecond {
				t.Errorf("vmm exit noticed only after %v", time.Since(start))
			}
			dir := filepath.Join(o.Config.Runtime.StateDir, "test", "sb1")
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("state dir left after failed start: %v", err)
			}
			if len(d.launched) != 1 || !d.launched[0].stopped {
				t.Errorf("vm not stopped after failed start")
			}
		})
	}
}

func TestStartValidates(t *testing.T) {
	d := &fakeDriver{}
	o := testOptions(t, d)
	o.ID = "../escape"
	if _, err := Start(context.Background(), o); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad id: %v", err)
	}
	o = testOptions(t, d)
	o.Config.Hypervisor.Accel = "kvm"
	if _, err := Start(context.Background(), o); !errors.Is(err, hypervisor.ErrNoKVM) {
		t.Fatalf("kvm forced without kvm: %v", err)
	}
	if len(d.launched) != 0 {
		t.Fatal("a vm was launched for invalid options")
	}
}
