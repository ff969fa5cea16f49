package admin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVirtiofsStatus: the check line says whether virtiofsd is there,
// executable and running, and what a missing one costs.
func TestVirtiofsStatus(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "virtiofsd")
	os.WriteFile(ok, []byte("#!/bin/sh\necho 'virtiofsd version 7.2.22'\n"), 0o755)
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte("x"), 0o644)
	fails := filepath.Join(dir, "fails")
	os.WriteFile(fails, []byte("#!/bin/sh\nexit 3\n"), 0o755)
	for _, tc := range []struct{ path, want string }{
		{ok, ok + " ok (virtiofsd version 7.2.22)"},
		{filepath.Join(dir, "none"), "no such file or directory: containers with bind mounts cannot run"},
		{plain, plain + " is not an executable file"},
		{fails, fails + " does not run (exit status 3)"},
	} {
		if got := virtiofsStatus(context.Background(), tc.path); !strings.Contains(got, tc.want) {
			t.Errorf("virtiofsStatus(%s) = %q, want it to hold %q", tc.path, got, tc.want)
		}
	}
}
