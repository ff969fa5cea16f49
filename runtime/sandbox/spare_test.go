package sandbox

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cocoonrt/cocoon/runtime/channel"
	"github.com/cocoonrt/cocoon/runtime/hypervisor"
)

const testSpareKey = "0123456789abcdef0123456789abcdef"

// fakeSpare serves one claim on key's socket under stateDir with answer
// (and the files, if any), and returns what it read.
func fakeSpare(t *testing.T, stateDir string, answer []byte, files ...*os.File) <-chan string {
	t.Helper()
	_, sock := SparePaths(stateDir, testSpareKey)
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := channel.ListenUnix("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		defer ln.Close()
		c, err := ln.AcceptUnix()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		n, _ := c.Read(buf)
		defer func() { got <- string(buf[:n]) }()
		_ = writeWithFiles(c, answer, files)
	}()
	return got
}

func reply(t *testing.T, r spareReply) []byte {
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestClaimSpareRefusesWhatItCannotTrust: a claim reads one answer, and
// one that is not JSON, that refuses, that lacks the agent connection it
// announces, or that puts the VM anywhere but in a spare's directory is
// refused, with the files it carried closed.
func TestClaimSpareRefusesWhatItCannotTrust(t *testing.T) {
	ctx := context.Background()
	pipeR, pipeW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pipeR.Close()
	defer pipeW.Close()
	for _, tc := range []struct {
		name   string
		answer func(stateDir string) []byte
		files  []*os.File
		want   string
	}{
		{name: "garbage", answer: func(string) []byte { return []byte("\x00\xffnot json") }, want: "cannot be read"},
		{name: "refusal", answer: func(string) []byte { return reply(t, spareReply{Error: "no"}) }, want: "refused the claim: no"},
		{name: "no handoff", answer: func(string) []byte { return reply(t, spareReply{}) }, want: "refused the claim"},
		{name: "agent connection missing", answer: func(d string) []byte {
			return reply(t, spareReply{Handoff: &hypervisor.Handoff{StateDir: filepath.Join(d, SpareNamespace, "spare-x")}, AgentConn: true})
		}, want: "no agent connection"},
		{name: "vm elsewhere", answer: func(string) []byte {
			return reply(t, spareReply{Handoff: &hypervisor.Handoff{StateDir: "/etc"}})
		}, files: []*os.File{pipeW}, want: "is in \"/etc\""},
		{name: "vm below a spare's directory", answer: func(d string) []byte {
			return reply(t, spareReply{Handoff: &hypervisor.Handoff{StateDir: filepath.Join(d, SpareNamespace, "a", "b")}})
		}, want: "not in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stateDir := t.TempDir()
			got := fakeSpare(t, stateDir, tc.answer(stateDir), tc.files...)
			c, err := claimSpare(ctx, stateDir, testSpareKey)
			if c != nil || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("claimSpare = %v, %v; want an error with %q", c, err, tc.want)
			}
			var req spareRequest
			if err := json.Unmarshal([]byte(<-got), &req); err != nil || req.Op != spareClaim || req.Key != testSpareKey {
				t.Errorf("the spare read %+v (%v)", req, err)
			}
		})
	}
}

// TestClaimSpareNone: no socket, or a socket nobody serves (a spare that
// was killed), is no spare, and no error.
func TestClaimSpareNone(t *testing.T) {
	stateDir := t.TempDir()
	if c, err := claimSpare(context.Background(), stateDir, testSpareKey); c != nil || err != nil {
		t.Errorf("no socket: %v, %v", c, err)
	}
	_, sock := SparePaths(stateDir, testSpareKey)
	os.MkdirAll(filepath.Dir(sock), 0o700)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if c, err := claimSpare(context.Background(), stateDir, testSpareKey); c != nil || err != nil {
		t.Errorf("a dead spare's socket: %v, %v", c, err)
	}
	if stopped, err := StopSpare(context.Background(), stateDir, testSpareKey); stopped || err != nil {
		t.Errorf("StopSpare of a dead spare: %v, %v", stopped, err)
	}
	if SpareHeld(stateDir, testSpareKey) {
		t.Error("SpareHeld without a spare process")
	}
}

func TestSpareKeyOf(t *testing.T) {
	for id, want := range map[string]string{
		"spare-" + testSpareKey + "-0a1b2c3d": testSpareKey,
		"spare-" + testSpareKey:               "",
		"spare-nothex-0a1b2c3d":               "",
		"template-" + testSpareKey:            "",
		"web":                                 "",
	} {
		if got := SpareKeyOf(id); got != want {
			t.Errorf("SpareKeyOf(%q) = %q, want %q", id, got, want)
		}
	}
}
