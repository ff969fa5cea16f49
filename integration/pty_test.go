package integration

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// runOnPty runs cmd with a new terminal of rows x cols as its stdin,
// stdout and stderr (a client's -it wants one), and returns what it wrote
// there and how it ended.
func runOnPty(t *testing.T, cmd *exec.Cmd, rows, cols uint16) (string, error) {
	t.Helper()
	master, slave, err := harness.OpenPty(rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	if err := cmd.Start(); err != nil {
		master.Close()
		slave.Close()
		t.Fatal(err)
	}
	slave.Close()
	var tty strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			k, err := master.Read(buf)
			tty.Write(buf[:k])
			if err != nil {
				return
			}
		}
	}()
	err = cmd.Wait()
	master.Close()
	<-done
	return tty.String(), err
}
