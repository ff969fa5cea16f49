package qmp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// unixFake is a fake QEMU on a unix socket pair that reads requests with
// their ancillary data, as QEMU's monitor does, and hands each received
// descriptor to got.
func unixFake(t *testing.T, got chan<- *os.File) *Client {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int, name string) *net.UnixConn {
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	cli, srv := conn(fds[0], "client"), conn(fds[1], "server")
	go func() {
		srv.Write([]byte(greeting))
		var pending []byte
		buf, oob := make([]byte, 4096), make([]byte, 256)
		for {
			n, oobn, _, _, err := srv.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			if oobn > 0 {
				msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
				if err != nil {
					t.Errorf("fake qemu: control message: %v", err)
					return
				}
				for _, m := range msgs {
					rights, err := unix.ParseUnixRights(&m)
					if err != nil {
						t.Errorf("fake qemu: rights: %v", err)
						return
					}
					for _, fd := range rights {
						got <- os.NewFile(uintptr(fd), "received")
					}
				}
			}
			pending = append(pending, buf[:n]...)
			for {
				i := bytes.IndexByte(pending, '\n')
				if i < 0 {
					break
				}
				var r request
				if err := json.Unmarshal(pending[:i], &r); err != nil || r.ID == nil {
					t.Errorf("fake qemu: bad request %q", pending[:i])
					return
				}
				pending = pending[i+1:]
				switch r.Execute {
				case "closefd":
					fmt.Fprintf(srv, `{"error": {"class": "GenericError", "desc": "File descriptor named 'x' not found"}, "id": %d}`+"\r\n", *r.ID)
				default:
					fmt.Fprintf(srv, `{"return": {}, "id": %d}`+"\r\n", *r.ID)
				}
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := New(ctx, cli, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); srv.Close() })
	return c
}

// TestSendFile checks that getfd carries the descriptor itself: what the
// fake writes through the one it received lands in the caller's file.
func TestSendFile(t *testing.T) {
	got := make(chan *os.File, 4)
	c := unixFake(t, got)
	path := filepath.Join(t.TempDir(), "state")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.SendFile(ctx, "snapshot", f); err != nil {
		t.Fatalf("SendFile: %v", err)
	}
	f.Close() // the receiver holds its own reference
	var rf *os.File
	select {
	case rf = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the fake received no descriptor")
	}
	defer rf.Close()
	if _, err := rf.Write([]byte("through the passed fd")); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(path); string(data) != "through the passed fd" {
		t.Fatalf("file holds %q", data)
	}
	// A command without a descriptor carries none.
	if err := c.Execute(ctx, "query-status", nil, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case extra := <-got:
		extra.Close()
		t.Fatal("a plain command carried a descriptor")
	default:
	}
	var qe *Error
	if err := c.CloseFile(ctx, "x"); !errors.As(err, &qe) {
		t.Fatalf("CloseFile of an unknown name = %v, want a *qmp.Error", err)
	}
}

func TestSendFileRefusals(t *testing.T) {
	// net.Pipe cannot carry descriptors: refused before a byte is
	// written, and the connection stays usable.
	c, _ := startFake(t, func(f *fakeQEMU, r request) { f.reply(r.ID, "{}") })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := c.SendFile(ctx, "snapshot", os.Stdin)
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Fatalf("SendFile over a pipe = %v, want not implemented", err)
	}
	if err := c.Execute(ctx, "query-status", nil, nil); err != nil {
		t.Fatalf("connection unusable after a refused SendFile: %v", err)
	}
	for _, name := range []string{"", "3", "a b", "a,b", strings.Repeat("n", 65)} {
		if err := c.SendFile(ctx, name, os.Stdin); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SendFile(%q) = %v, want invalid argument", name, err)
		}
	}
	// A closed file is refused without touching the connection.
	f, _ := os.Open(os.DevNull)
	f.Close()
	if err := c.SendFile(ctx, "closed", f); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("SendFile of a closed file = %v, want invalid argument", err)
	}
	if err := c.Execute(ctx, "query-status", nil, nil); err != nil {
		t.Fatalf("connection unusable after a closed file: %v", err)
	}
}
