package admin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cocoonrt/cocoon/runtime/containerdconfig"
)

// criStatus says whether containerd's configuration at configPath
// (empty: containerd's default file) has Cocoon's CRI runtime handler,
// as `containerd config dump` reads it, and whether the containerd
// running on it started before it last changed. Kubernetes needs it, a
// VM does not: it is reported, not required.
func criStatus(ctx context.Context, configPath string) string {
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return "not checked: containerd is not installed"
	}
	out, err := commandFirstLine(ctx, bin, "--version")
	if err != nil {
		return fmt.Sprintf("not checked: %s --version: %v", bin, err)
	}
	version := "containerd ?"
	if major, minor, err := containerdconfig.ParseVersion(out); err == nil {
		version = fmt.Sprintf("containerd %d.%d", major, minor)
	}
	path, args := configPath, []string{"--config", configPath, "config", "dump"}
	if path == "" {
		path, args = containerdconfig.DefaultPath, []string{"config", "dump"}
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return fmt.Sprintf("not configured: %s does not exist, and containerd's defaults have no handler %s (%s); `cocoon deploy install` adds it", path, containerdconfig.Handler, version)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dump, err := exec.CommandContext(ctx, bin, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%v: %s", err, lastLine(ee.Stderr))
		}
		return fmt.Sprintf("not checked: containerd config dump: %v (%s, %s)", err, version, path)
	}
	line := criLine(dump, version, path)
	if started, ok := runningContainerd(configPath); ok {
		line += staleNote(started, path, containerdconfig.DropInPath(path))
	}
	return line
}

// criLine is what a dump says of the handler, for the check line.
func criLine(dump []byte, version, path string) string {
	h, err := containerdconfig.ParseDump(dump, containerdconfig.Handler)
	if err != nil {
		return fmt.Sprintf("not checked: %v (%s, %s)", err, version, path)
	}
	where := fmt.Sprintf("(%s, %s)", version, path)
	switch {
	case !h.Found() && h.CRIDisabled != "":
		return fmt.Sprintf("not configured: the CRI plugin is disabled (disabled_plugins has %q) %s", h.CRIDisabled, where)
	case !h.Found():
		return fmt.Sprintf("not configured: no runtime %s among the CRI runtimes %s; `cocoon deploy install` adds it, `cocoon containerd-config` prints it", containerdconfig.Handler, where)
	case h.Problem() != "":
		return fmt.Sprintf("handler %s configured %s, but %s", containerdconfig.Handler, where, h.Problem())
	}
	return fmt.Sprintf("handler %s configured %s", containerdconfig.Handler, where)
}

// staleNote says which of files changed after a containerd that started
// at started read its configuration; "" when none did.
func staleNote(started time.Time, files ...string) string {
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && fi.ModTime().After(started) {
			return fmt.Sprintf("; the running containerd started before %s changed: restart it for the change to take effect", f)
		}
	}
	return ""
}

// runningContainerd finds the running containerd daemon that reads
// configPath (empty: one started without --config, which reads the
// default file) and when it started.
func runningContainerd(configPath string) (time.Time, bool) {
	boot, ok := bootTime()
	if !ok {
		return time.Time{}, false
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if filepath.Base(args[0]) != "containerd" || daemonConfig(args[1:]) != configPath {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		if err != nil {
			continue
		}
		// Field 22, starttime, in clock ticks (100 a second on Linux)
		// since boot; the fields after the command's closing paren.
		_, rest, ok := bytes.Cut(stat, []byte(") "))
		if fields := strings.Fields(string(rest)); ok && len(fields) > 19 {
			if ticks, err := strconv.ParseInt(fields[19], 10, 64); err == nil {
				return boot.Add(time.Duration(ticks) * time.Second / 100), true
			}
		}
	}
	return time.Time{}, false
}

// daemonConfig is the --config of a containerd command line (its
// arguments) that runs the daemon, "" for none; "-" for one that runs a
// subcommand (config dump, ...).
func daemonConfig(args []string) string {
	config := ""
	for i := 0; i < len(args); i++ {
		name, value, inline := strings.Cut(args[i], "=")
		switch {
		case !strings.HasPrefix(name, "-"):
			return "-"
		case inline:
		case takesValue(name) && i+1 < len(args):
			i++
			value = args[i]
		}
		if name == "--config" || name == "-c" {
			config = value
		}
	}
	return config
}

// takesValue says whether a global flag of containerd's takes a value.
func takesValue(flag string) bool {
	switch flag {
	case "--config", "-c", "--log-level", "-l", "--address", "-a", "--root", "--state":
		return true
	}
	return false
}

func bootTime() (time.Time, bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(s, 0), true
			}
		}
	}
	return time.Time{}, false
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}
