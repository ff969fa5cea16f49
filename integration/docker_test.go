package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
)

// TestDockerRunc drives a private dockerd (moby v2) with the docker CLI
// on each containerd, with runc only: the harness the Docker tests of
// Cocoon stand on (the daemon's flags and configuration, the runtimes it
// registers, the image that docker load brings, a port published on
// 127.0.0.1, Leftovers), shown to work where nothing of Cocoon is
// involved. run attached, then run -d, exec, logs, stop and rm, then a
// published port that the host fetches; after rm -f and the daemon's
// stop nothing of its containers is left.
func TestDockerRunc(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, _, _ := shimContainerd(t, v)
			d := harness.NewDocker(t, c)
			img := d.ImportBusybox(t)
			runtimes := d.Run(t, "info", "--format", "{{json .Runtimes}}")
			for _, rt := range []string{"runc", harness.DockerCocoonRuntime, harness.DockerCocoonConfigPathRuntime} {
				if !strings.Contains(runtimes, `"`+rt+`"`) {
					t.Errorf("docker info's runtimes lack %s: %s", rt, runtimes)
				}
			}

			if out := d.Run(t, "run", "--rm", img, "echo", "hi"); out != "hi\n" {
				t.Errorf("run --rm echo hi: %q", out)
			}

			d.Run(t, "run", "-d", "--name", "life", img, "sh", "-c", "echo started; trap 'echo stopping; exit 0' TERM; while :; do sleep 1; done")
			waitDockerLogs(t, d, "life", "started")
			if out := d.Run(t, "exec", "life", "echo", "exec-ok"); out != "exec-ok\n" {
				t.Errorf("exec: %q", out)
			}
			d.Run(t, "stop", "life")
			if out := d.Run(t, "ps", "-a", "--filter", "name=life", "--format", "{{.Status}}"); !strings.HasPrefix(out, "Exited (0)") {
				t.Errorf("docker ps -a after stop: %q", out)
			}
			waitDockerLogs(t, d, "life", "stopping")
			d.Run(t, "rm", "life")

			port := freeTCPPort(t)
			d.Run(t, "run", "-d", "--name", "web", "-p", fmt.Sprintf("127.0.0.1:%d:80", port), img,
				"sh", "-c", "mkdir -p /www && echo hello-from-docker > /www/index.html && exec httpd -f -p 80 -h /www")
			if body := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/index.html", port)); body != "hello-from-docker\n" {
				t.Errorf("the published port answered %q", body)
			}

			d.Run(t, "rm", "-f", "web")
			dockerDone(t, d)
		})
	}
}

// waitDockerLogs waits up to 30 s for docker logs of id to show want.
func waitDockerLogs(t *testing.T, d *harness.Docker, id, want string) {
	t.Helper()
	waitShows(t, "docker logs "+id, want, func() string {
		out, _, _ := d.RunErr("logs", id)
		return out
	})
}

// dockerDone checks that the containers the test removed left nothing on
// the host, then stops the daemon and checks again.
func dockerDone(t *testing.T, d *harness.Docker) {
	t.Helper()
	if left := d.WaitClean(30 * time.Second); left != "" {
		t.Errorf("left on the host after docker rm -f:\n%s", left)
	}
	if err := d.Stop(); err != nil {
		t.Error(err)
	}
	if left := d.Leftovers(); left != "" {
		t.Errorf("left on the host after dockerd stopped:\n%s", left)
	}
}

// httpGet fetches url from the host with Go's HTTP client, trying for
// 30 s, and returns the body of the first 200 answer; "" (with the test
// failed) if none comes.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		var body string
		if body, err = httpGetOnce(url); err == nil {
			return body
		}
	}
	t.Errorf("GET %s from the host: %v", url, err)
	return ""
}

func httpGetOnce(url string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %q", resp.Status, body)
	}
	return string(body), nil
}
