package nice

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestSetEveryThread lowers every thread of a child and reads each back
// from /proc.
func TestSetEveryThread(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	own, err := Own()
	if err != nil {
		t.Fatal(err)
	}
	want := min(own+5, 19)
	if err := Set(cmd.Process.Pid, want); err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		// /proc/<pid>/task/<tid>/stat: the nice value is the 19th field,
		// the 17th after the parenthesised command name.
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/task/" + task.Name() + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 17 || f[16] != strconv.Itoa(want) {
			t.Errorf("thread %s of the child: stat %q, want nice %d", task.Name(), f, want)
		}
	}
	if err := Set(1<<30, 0); err == nil {
		t.Error("Set of a process that does not exist succeeded")
	}
}
