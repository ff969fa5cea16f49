package channel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func host(err error) Host { return Host{VhostVsock: func() error { return err }} }

func TestSelect(t *testing.T) {
	missing := errors.New("no such file or directory")
	cases := []struct {
		name    string
		want    Kind
		host    Host
		got     Kind
		reason  string
		wantErr string
	}{
		{"auto with vhost-vsock", Auto, host(nil), Vsock, "available", ""},
		{"auto without vhost-vsock", Auto, host(missing), Serial, "no such file", ""},
		{"empty is auto", "", host(missing), Serial, "unusable", ""},
		{"serial forced", Serial, host(nil), Serial, "configured", ""},
		{"vsock forced and there", Vsock, host(nil), Vsock, "configured", ""},
		{"vsock forced and absent", Vsock, host(missing), "", "", "vhost-vsock"},
		{"unknown", "pipe", host(nil), "", "", `"pipe"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, why, err := Select(tc.want, tc.host)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.got || !strings.Contains(why, tc.reason) {
				t.Fatalf("got %s %q %v, want %s with reason containing %q", got, why, err, tc.got, tc.reason)
			}
		})
	}
}

func TestDialSerial(t *testing.T) {
	p := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	c, err := Endpoint{Kind: Serial, SocketPath: p}.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil || string(buf) != "hi" {
		t.Fatalf("read %q %v", buf, err)
	}
	if _, err := (Endpoint{Kind: Serial, SocketPath: p + ".none"}).Dial(context.Background()); err == nil {
		t.Fatal("dial of a missing socket succeeded")
	}
}

// TestDialVsockGivesUpAtDeadline: with no vsock here (or no listener on
// CID 3), the retry loop must end with the context.
func TestDialVsockGivesUpAtDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Endpoint{Kind: Vsock, CID: 3, Port: VsockPort}.Dial(ctx)
	if err == nil {
		t.Skip("something answers on vsock cid 3 port 1024 on this host; the retry path is not exercised")
	}
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("err = %v after %v, want a deadline error soon after 150ms", err, time.Since(start))
	}
}

// listenLong listens on a unix socket at path, which may be longer than
// a sockaddr_un holds, as QEMU does relative to its working directory.
func listenLong(t *testing.T, path string) net.Listener {
	t.Helper()
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	l, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestDialSerialLongPath: a state dir named after a 76-byte namespace and
// a 76-byte id puts the agent socket far beyond the 107 bytes of a
// sockaddr_un; Dial reaches it anyway, and an error names the real path.
func TestDialSerialLongPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("n", 76), strings.Repeat("i", 76))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "agent.sock")
	if len(p) <= MaxSocketPath {
		t.Fatalf("path %s is not long enough to test", p)
	}
	l := listenLong(t, p)
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	c, err := Endpoint{Kind: Serial, SocketPath: p}.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("read %q %v", buf, err)
	}
	for _, missing := range []string{p + ".none", filepath.Join(dir+".none", "agent.sock")} {
		_, err := DialUnix(context.Background(), missing)
		if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) || strings.Contains(err.Error(), "/proc/self/fd") {
			t.Errorf("dial %s: %v, want not exist naming the path", missing, err)
		}
	}
}
