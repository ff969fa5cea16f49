package stdio

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
)

func mkfifo(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// clientReader opens a fifo for reading the way containerd's clients do
// (before the task exists) and returns everything read until EOF.
func clientReader(t *testing.T, path string) <-chan string {
	t.Helper()
	r, err := fifo.OpenFifo(context.Background(), path, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 1)
	go func() {
		defer r.Close()
		b, _ := io.ReadAll(r)
		out <- string(b)
	}()
	return out
}

func within(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("timed out")
		return ""
	}
}

// TestFifos: the output reaches the client's readers, which see EOF once
// CloseOutput is called; stdin flows from the client's writer.
func TestFifos(t *testing.T) {
	dir := t.TempDir()
	in, out, errp := mkfifo(t, dir, "in"), mkfifo(t, dir, "out"), mkfifo(t, dir, "err")
	gotOut, gotErr := clientReader(t, out), clientReader(t, errp)
	stdinW, err := fifo.OpenFifo(context.Background(), in, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pio, err := Open(ctx, "ns", "c1", Config{Stdin: in, Stdout: out, Stderr: errp})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(pio.Stdout(), "hello out")
	fmt.Fprint(pio.Stderr(), "hello err")
	if err := pio.CloseOutput(); err != nil {
		t.Fatal(err)
	}
	if s := within(t, gotOut); s != "hello out" {
		t.Errorf("stdout = %q", s)
	}
	if s := within(t, gotErr); s != "hello err" {
		t.Errorf("stderr = %q", s)
	}

	fmt.Fprint(stdinW, "typed")
	stdinW.Close()
	b, err := io.ReadAll(pio.Stdin())
	if err != nil || string(b) != "typed" {
		t.Errorf("stdin = %q, %v", b, err)
	}
	if err := pio.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestTerminal: with a terminal there is no stderr.
func TestTerminal(t *testing.T) {
	dir := t.TempDir()
	out := mkfifo(t, dir, "out")
	got := clientReader(t, out)
	pio, err := Open(context.Background(), "ns", "c1", Config{Stdout: out, Terminal: true})
	if err != nil {
		t.Fatal(err)
	}
	if pio.Stderr() != nil {
		t.Error("a terminal process has a stderr")
	}
	fmt.Fprint(pio.Stdout(), "tty")
	pio.Close(context.Background())
	if s := within(t, got); s != "tty" {
		t.Errorf("stdout = %q", s)
	}
}

// TestCloseStdinReleasesRead: a read waiting on stdin returns once it is
// closed, even if the client never writes.
func TestCloseStdinReleasesRead(t *testing.T) {
	dir := t.TempDir()
	in := mkfifo(t, dir, "in")
	pio, err := Open(context.Background(), "ns", "c1", Config{Stdin: in})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := pio.Stdin().Read(make([]byte, 8))
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	pio.CloseStdin()
	select {
	case err := <-done:
		if err == nil {
			t.Error("read returned no error after close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("read still blocked after CloseStdin")
	}
}

// TestFileURI appends stdout and stderr to one file.
func TestFileURI(t *testing.T) {
	path := filepath.Join(t.TempDir(), "logs", "c1.log")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	uri := "file://" + path
	pio, err := Open(context.Background(), "ns", "c1", Config{Stdout: uri, Stderr: uri})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(pio.Stdout(), "out\n")
	fmt.Fprint(pio.Stderr(), "err\n")
	if err := pio.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old\nout\nerr\n" {
		t.Errorf("file = %q", b)
	}
}

// logger writes a logging binary that copies fd 3 and fd 4 into files next
// to it, with its environment and arguments, after saying it is ready.
func writeLogger(t *testing.T, ready string) (bin, dir string) {
	t.Helper()
	dir = t.TempDir()
	bin = filepath.Join(dir, "logger.sh")
	script := fmt.Sprintf(`#!/bin/sh
env > %[1]s/env
echo "$@" > %[1]s/args
%[2]s
exec 5>&-
cat <&3 > %[1]s/stdout &
cat <&4 > %[1]s/stderr &
wait
`, dir, ready)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, dir
}

// TestBinaryURI runs a logging binary with containerd's protocol: fds 3
// and 4, ready on fd 5, CONTAINER_ID and CONTAINER_NAMESPACE, the query as
// arguments; Close waits until it has everything.
func TestBinaryURI(t *testing.T) {
	for _, scheme := range []string{"binary", "binary-v2"} {
		t.Run(scheme, func(t *testing.T) {
			bin, dir := writeLogger(t, "printf r >&5")
			uri := scheme + "://" + bin + "?level=debug"
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pio, err := Open(ctx, "ns1", "c1", Config{Stdout: uri, Stderr: uri})
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprint(pio.Stdout(), "to out")
			fmt.Fprint(pio.Stderr(), "to err")
			if err := pio.Close(ctx); err != nil {
				t.Fatal(err)
			}
			for file, want := range map[string]string{"stdout": "to out", "stderr": "to err", "args": "level debug\n"} {
				if b, _ := os.ReadFile(filepath.Join(dir, file)); string(b) != want {
					t.Errorf("%s = %q, want %q", file, b, want)
				}
			}
			env, _ := os.ReadFile(filepath.Join(dir, "env"))
			for _, kv := range []string{"CONTAINER_ID=c1", "CONTAINER_NAMESPACE=ns1"} {
				if !strings.Contains(string(env), kv) {
					t.Errorf("logger environment lacks %s:\n%s", kv, env)
				}
			}
		})
	}
}

// TestBinaryV2NeedsReady: binary-v2 wants a byte on fd 5, binary takes EOF.
func TestBinaryV2NeedsReady(t *testing.T) {
	bin, _ := writeLogger(t, "")
	ctx := context.Background()
	if _, err := Open(ctx, "ns", "c1", Config{Stdout: "binary-v2://" + bin}); err == nil {
		t.Error("binary-v2 logger that never said ready was accepted")
	}
	pio, err := Open(ctx, "ns", "c1", Config{Stdout: "binary://" + bin})
	if err != nil {
		t.Fatalf("binary logger that closed fd 5: %v", err)
	}
	pio.Close(ctx)
}

// TestUnknownScheme is an invalid argument.
func TestUnknownScheme(t *testing.T) {
	_, err := Open(context.Background(), "ns", "c1", Config{Stdout: "tcp://1.2.3.4:5"})
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("got %v, want invalid argument", err)
	}
}

// TestDropReadersUnblocksAbandonedOutput: a client that stopped reading
// leaves writes blocked on the shim's own read side; once it is dropped,
// the blocked write fails instead of hanging.
func TestDropReadersUnblocksAbandonedOutput(t *testing.T) {
	dir := t.TempDir()
	out := mkfifo(t, dir, "out")
	r, err := fifo.OpenFifo(context.Background(), out, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	pio, err := Open(context.Background(), "ns", "c1", Config{Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	defer pio.Close(context.Background())
	r.Close() // the client goes away without reading

	done := make(chan error, 1)
	go func() {
		chunk := make([]byte, 64<<10)
		for {
			if _, err := pio.Stdout().Write(chunk); err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		t.Fatalf("write failed before the readers were dropped: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	pio.DropReaders()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("write ended without an error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("write still blocked after DropReaders")
	}
}
