// Command demo is what `make demo` runs once Cocoon is installed: it runs
// `uname -r` in a container in a microVM through containerd and prints
// the guest's kernel next to the host's; with a template, it runs it
// again, taking over the spare that the first start left.
//
// It uses the containerd that runs on this host if there is one (in a
// namespace of its own, removed at the end), else starts a private
// containerd (Debian's 1.6) whose root, state and socket live in a
// temporary directory, and stops it at the end: the host is left as it
// was found. The image is a one-layer busybox built from the host's
// /bin/busybox and imported locally; no registry is involved.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
	"github.com/cocoonrt/cocoon/oci"
	"github.com/cocoonrt/cocoon/runtime/admin"
	"github.com/cocoonrt/cocoon/runtime/config"
	"github.com/cocoonrt/cocoon/runtime/sandbox"
	"github.com/cocoonrt/cocoon/runtime/template"
)

// systemSocket is where a host's containerd listens by default.
const systemSocket = "/run/containerd/containerd.sock"

// namespace holds everything the demo creates in a host's containerd.
const namespace = "cocoon-demo"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root: containerd and the VM need it")
	}
	shim, err := exec.LookPath(harness.ShimBinary)
	if err != nil {
		return fmt.Errorf("%s is not on PATH: run `make install`", harness.ShimBinary)
	}
	env, err := admin.LoadEnv("")
	if err != nil {
		return err
	}
	c, cleanup, err := containerd(filepath.Dir(shim))
	if err != nil {
		return err
	}
	defer cleanup()
	// The shim leaves the namespace's directories, empty, behind.
	defer os.Remove(filepath.Join(env.Config.Runtime.DataDir, sandbox.ContainersDirName, namespace))
	defer os.Remove(filepath.Join(env.Config.Runtime.StateDir, namespace))

	image, err := harness.Import(c)
	if err != nil {
		return err
	}
	host, err := exec.Command("uname", "-r").Output()
	if err != nil {
		return err
	}
	fmt.Printf("--- host kernel:  %s\n", strings.TrimSpace(string(host)))
	// With a template of the default shape (`make install` makes it),
	// the container is asked to start from it (io.cocoon.template =
	// required): that it ran then shows which way it started.
	args := []string{"run", "--rm", "--runtime", "io.containerd.cocoon.v2"}
	how, err := startsFrom(env)
	if err != nil {
		return err
	}
	if how.template != "" {
		args = append(args, "--annotation", oci.AnnotationTemplate+"="+config.TemplateRequired)
	}
	args = append(args, image, "demo", "uname", "-r")
	fmt.Printf("--- ctr %s\n", strings.Join(args, " "))
	guest, took, err := ctrRun(ctx, c, args)
	if err != nil {
		return err
	}
	fmt.Printf("--- guest kernel: %s   (microVM, %.1f s end to end, %s)\n", guest, took.Seconds(), how)
	if how.template == "" || !env.Config.Template.Spare {
		return nil
	}
	// That start left a spare of its shape; the same command again takes
	// it over. The spare that the second start leaves is stopped: the
	// demo leaves no VM running.
	stateDir, key := env.Config.Runtime.StateDir, how.template
	defer stopSpare(stateDir, key)
	spare, err := waitSpare(ctx, stateDir, key)
	if err != nil {
		return err
	}
	guest, took, err = ctrRun(ctx, c, args)
	if err != nil {
		return err
	}
	how.spare = true
	if _, err := os.Stat(spare); err == nil {
		how.spare, how.why = false, "its spare was not taken over"
	}
	fmt.Printf("--- again:        %s   (microVM, %.1f s end to end, %s)\n", guest, took.Seconds(), how)
	return nil
}

// ctrRun runs ctr with args and returns what it printed and how long it
// took.
func ctrRun(ctx context.Context, c *harness.Containerd, args []string) (string, time.Duration, error) {
	start := time.Now()
	var out, stderr strings.Builder
	cmd := c.CtrCommand(ctx, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", 0, fmt.Errorf("ctr run: %w\n%s", err, stderr.String())
	}
	return strings.TrimSpace(out.String()), time.Since(start), nil
}

// waitSpare waits for the spare of template key to wait for a claim, and
// returns its state directory.
func waitSpare(ctx context.Context, stateDir, key string) (string, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		if dir := sandbox.SpareDir(stateDir, key); dir != "" && sandbox.SpareWaits(stateDir, key) {
			return dir, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no spare of template %s after a minute (its log: `cocoon template ls`, %s)", key, template.LogName)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopSpare stops the spare of key, once it is made, if one is there.
func stopSpare(stateDir, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := sandbox.EndSpare(ctx, stateDir, key); err != nil {
		fmt.Fprintln(os.Stderr, "demo: stop the spare:", err)
	}
}

// start says which way the demo's sandbox starts.
type start struct {
	// template is the key of the template it starts from; "" for a boot.
	template string
	// spare says it took the template's spare over.
	spare bool
	// why it boots, or does not take the spare.
	why string
}

func (s start) String() string {
	switch {
	case s.template == "":
		return "booted: " + s.why
	case s.spare:
		return "taking the spare of template " + s.template[:12] + " over"
	case s.why != "":
		return "started from template " + s.template[:12] + ": " + s.why
	}
	return "started from template " + s.template[:12]
}

// startsFrom finds the template of the default shape, verified, if there
// is one.
func startsFrom(env *admin.Env) (start, error) {
	if env.Config.Template.Mode == config.TemplateNever {
		return start{why: "template.mode is never"}, nil
	}
	shape, err := env.CurrentShape()
	if err != nil {
		return start{why: err.Error()}, nil
	}
	t, err := env.Templates().Lookup(shape)
	if err != nil {
		return start{why: "no usable template of this shape (" + err.Error() + ")"}, nil
	}
	return start{template: t.Key()}, nil
}

// containerd returns the host's containerd if one answers, else a private
// one with shimDir on its PATH, and what undoes the demo's traces.
func containerd(shimDir string) (*harness.Containerd, func(), error) {
	if conn, err := net.DialTimeout("unix", systemSocket, time.Second); err == nil {
		conn.Close()
		ctr, err := exec.LookPath("ctr")
		if err != nil {
			return nil, nil, err
		}
		c := &harness.Containerd{Address: systemSocket, Namespace: namespace, Bin: filepath.Dir(ctr)}
		fmt.Printf("--- using the running containerd (%s), namespace %s\n", systemSocket, namespace)
		list, err := c.Ctr("namespaces", "list", "-q")
		if err != nil {
			return nil, nil, err
		}
		existed := false
		for _, ns := range strings.Fields(list) {
			existed = existed || ns == namespace
		}
		return c, func() { clean(c, existed) }, nil
	}
	fmt.Println("--- no containerd running: starting a private containerd 1.6 for the demo")
	c, err := harness.Start("1.6", harness.WithShimDir(shimDir))
	if err != nil {
		return nil, nil, err
	}
	c.Namespace = namespace
	return c, func() {
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
		}
		fmt.Println("--- private containerd stopped and removed")
	}, nil
}

// clean deletes what the demo left in a host's containerd: the container
// if a failure left it and, unless the namespace was there before, the
// image, its snapshots and the namespace.
func clean(c *harness.Containerd, existed bool) {
	_, _ = c.Ctr("task", "delete", "-f", "demo")
	_, _ = c.Ctr("container", "delete", "demo")
	if existed {
		return
	}
	_, _ = c.Ctr("images", "rm", harness.BusyboxRef)
	// The unpacked layer: a one-layer image has one snapshot.
	if list, err := c.Ctr("snapshots", "list"); err == nil {
		for _, l := range strings.Split(list, "\n")[1:] {
			if f := strings.Fields(l); len(f) > 0 {
				_, _ = c.Ctr("snapshots", "rm", f[0])
			}
		}
	}
	if _, err := c.Ctr("namespaces", "remove", namespace); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
	}
}
