package main

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/cocoonrt/cocoon/integration/harness"
	"github.com/cocoonrt/cocoon/runtime/config"
)

// The network figures' settings.
const (
	// netSubnet is the private subnet of the bench's own bridge network.
	netSubnet = "10.213.0.0/24"
	// iperfRoot is the Debian root with iperf3 that `make bench` makes
	// (integration/debian-image.sh DEST iperf3 iperf3), and iperfRef the
	// name the bench imports it as.
	iperfRoot = "/opt/cocoon-test/images/debian-iperf3.tar"
	iperfRef  = "docker.io/cocoon/debian-iperf3:bench"
	// iperfRuns is how many runs of iperfSeconds each direction gets.
	iperfRuns    = 3
	iperfSeconds = 5
	// httpGets is how many GETs the latency figure times, after
	// httpWarmup that it does not.
	httpGets   = 200
	httpWarmup = 20
	// httpPage is the page busybox httpd serves, a line of it.
	httpPage = "cocoon bench page"
)

// netFigures are the network figures of both runtimes: index 0 is
// Cocoon, 1 runc.
type netFigures struct {
	// up is TCP from the host into the container (the host's iperf3
	// client sends to the container's server), down the reverse (-R),
	// in Mbit/s as the receiver counted them, one per run.
	up, down [2][]float64
	// get is each HTTP GET of the published port on a fresh
	// connection, in ms.
	get [2][]float64
	// accel and channel are what Cocoon's sandboxes ran with, as the
	// shim logged them.
	accel, channel string
}

// startingLine matches the shim's "starting sandbox" line, whose accel
// and channel fields say how the sandbox runs.
var startingLine = regexp.MustCompile(`msg="starting sandbox"(.*)`)

// errNetworkTools says that something the network figures need is not
// on this machine.
var errNetworkTools = errors.New("the network figures' tools are not installed (make test-deps, then make bench)")

// benchNetwork measures TCP throughput with iperf3 and HTTP latency
// through a published port, for Cocoon and runc in turn, with nerdctl on
// a bridge network of the bench's own, through the bench's private
// containerd 1.6: the only runc shim on this host is Debian's (1.6), and
// containerd 2.4 fails to start it for nerdctl's containers ("type with
// url ...: not found"). It leaves no container, network, netns, tap or
// iptables rule behind, also when ctx is cancelled.
func benchNetwork(ctx context.Context, cfg *config.Config) (f netFigures, retErr error) {
	for _, p := range []string{iperfRoot, "/usr/bin/iperf3"} {
		if _, err := os.Stat(p); err != nil {
			return f, fmt.Errorf("%w: %v", errNetworkTools, err)
		}
	}
	b, err := startCtrd(cfg.Runtime.StateDir, cfg.Runtime.DataDir)
	if err != nil {
		return f, err
	}
	defer b.close()
	c := b.c
	if err := importRoot(c, iperfRoot, iperfRef, []string{"/usr/bin/iperf3", "-s"}); err != nil {
		return f, fmt.Errorf("import %s: %w", iperfRoot, err)
	}
	n, err := harness.OpenNerdctl(c)
	if errors.Is(err, harness.ErrNerdctlNotInstalled) {
		return f, fmt.Errorf("%w: %v", errNetworkTools, err)
	}
	if err != nil {
		return f, err
	}
	// Before containerd stops (b.close, deferred first): the containers,
	// then the network with its bridge, pool and iptables rules.
	defer func() {
		if err := n.Cleanup(); err != nil && retErr == nil {
			retErr = fmt.Errorf("nerdctl cleanup: %w", err)
		}
		waitNoShims(c, 20*time.Second)
		if left := n.Leftovers(cfg.Runtime.StateDir); left != "" && retErr == nil {
			retErr = fmt.Errorf("left on the host after the network figures:\n%s", left)
		}
	}()
	network, err := n.CreateNetwork("--subnet", netSubnet)
	if err != nil {
		return f, err
	}
	for i, rt := range []string{runtimeCocoon, runtimeRunc} {
		if f.up[i], f.down[i], err = iperfFigures(ctx, n, rt, network); err != nil {
			return f, fmt.Errorf("%s: iperf3: %w", rt, err)
		}
		if f.get[i], err = httpFigures(ctx, n, rt, network, b.image); err != nil {
			return f, fmt.Errorf("%s: http: %w", rt, err)
		}
	}
	if m := startingLine.FindStringSubmatch(c.Log()); m != nil {
		fields := logFields(m[1])
		f.accel, f.channel = fields["accel"], fields["channel"]
	}
	return f, nil
}

// nerd runs nerdctl with args, bound to ctx and to two minutes, and
// returns its stdout; the error carries stderr.
func nerd(ctx context.Context, n *harness.Nerdctl, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var stdout, stderr strings.Builder
	cmd := n.Command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("nerdctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// runServer starts a detached container of runtime rt on network with
// args (after `nerdctl run -d`) and returns its address. The
// caller removes it (removeServer); Cleanup does if it cannot.
func runServer(ctx context.Context, n *harness.Nerdctl, rt, network, name string, args ...string) (string, error) {
	full := append([]string{"run", "-d", "--runtime", rt, "--name", name, "--net", network}, args...)
	if _, err := nerd(ctx, n, full...); err != nil {
		return "", err
	}
	out, err := nerd(ctx, n, "inspect", "-f", "{{.NetworkSettings.IPAddress}}", name)
	ip := strings.TrimSpace(out)
	if err == nil && net.ParseIP(ip) == nil {
		err = fmt.Errorf("nerdctl inspect %s: address %q", name, ip)
	}
	return ip, err
}

// removeServer removes container name; it must work after ctx was
// cancelled.
func removeServer(n *harness.Nerdctl, name string) error {
	_, err := nerd(context.Background(), n, "rm", "-f", name)
	return err
}

// iperfFigures runs `iperf3 -s` in a container of runtime rt and, from
// the host, iperfRuns runs of iperfSeconds each way, alternated, after
// an untimed warm-up run that also waits for the server. Mbit/s.
func iperfFigures(ctx context.Context, n *harness.Nerdctl, rt, network string) (up, down []float64, retErr error) {
	name := "iperf-" + shortName(rt)
	ip, err := runServer(ctx, n, rt, network, name, iperfRef, "iperf3", "-s")
	defer func() {
		if err := removeServer(n, name); err != nil && retErr == nil {
			retErr = err
		}
	}()
	if err != nil {
		return nil, nil, err
	}
	if _, err := iperfRetried(ctx, ip, 1, false, time.Minute); err != nil {
		return nil, nil, fmt.Errorf("the server at %s never answered: %w", ip, err)
	}
	for k := 0; k < iperfRuns; k++ {
		u, err := iperfRetried(ctx, ip, iperfSeconds, false, iperfRestart)
		if err != nil {
			return up, down, err
		}
		d, err := iperfRetried(ctx, ip, iperfSeconds, true, iperfRestart)
		if err != nil {
			return up, down, err
		}
		up, down = append(up, u), append(down, d)
	}
	return up, down, nil
}

// iperfRestart bounds the retries of a run: after each test the server
// closes its listening socket and opens a new one, and a client that
// comes in between is refused (under TCG the gap is long enough to hit).
const iperfRestart = 10 * time.Second

// iperfRetried is iperf, tried again every 200 ms for within while it
// fails: a run that failed measured nothing.
func iperfRetried(ctx context.Context, ip string, seconds int, reverse bool, within time.Duration) (float64, error) {
	for deadline := time.Now().Add(within); ; {
		mbits, err := iperf(ctx, ip, seconds, reverse)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return mbits, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// iperf runs the host's iperf3 client against the server at ip for
// seconds (-R: the server sends) and returns what the receiving end
// counted, in Mbit/s.
func iperf(ctx context.Context, ip string, seconds int, reverse bool) (float64, error) {
	args := []string{"-c", ip, "-t", fmt.Sprint(seconds), "-J", "--connect-timeout", "3000"}
	if reverse {
		args = append(args, "-R")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(seconds+30)*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "iperf3", args...)
	// Its own process group: a ^C reaches the bench, which ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, runErr := cmd.Output()
	if ctx.Err() != nil {
		return 0, fmt.Errorf("iperf3 %s: %w", strings.Join(args, " "), ctx.Err())
	}
	var r struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, fmt.Errorf("iperf3 %s: %v: %w", strings.Join(args, " "), runErr, err)
	}
	if r.Error != "" || runErr != nil {
		return 0, fmt.Errorf("iperf3 %s: %v: %s", strings.Join(args, " "), runErr, r.Error)
	}
	return r.End.SumReceived.BitsPerSecond / 1e6, nil
}

// httpFigures runs busybox httpd in a container of runtime rt with its
// port 80 published on 127.0.0.1, and times httpGets sequential GETs of
// a small page from the host, each on a new TCP connection, after
// httpWarmup untimed ones (the first of which waits for the server). ms.
func httpFigures(ctx context.Context, n *harness.Nerdctl, rt, network, image string) (_ []float64, retErr error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	name := "httpd-" + shortName(rt)
	_, err = runServer(ctx, n, rt, network, name, "-p", fmt.Sprintf("127.0.0.1:%d:80", port), image,
		"sh", "-c", fmt.Sprintf("mkdir -p /www && echo '%s' > /www/index.html && exec httpd -f -p 80 -h /www", httpPage))
	defer func() {
		if err := removeServer(n, name); err != nil && retErr == nil {
			retErr = err
		}
	}()
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	url := fmt.Sprintf("http://127.0.0.1:%d/index.html", port)
	for deadline := time.Now().Add(time.Minute); ; {
		if _, err = get(ctx, client, url); err == nil {
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return nil, fmt.Errorf("%s never answered: %w", url, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	var out []float64
	for k := 0; k < httpWarmup+httpGets; k++ {
		took, err := get(ctx, client, url)
		if err != nil {
			return out, err
		}
		if k >= httpWarmup {
			out = append(out, ms(took))
		}
	}
	return out, nil
}

// get fetches url, which must answer 200 with the line httpPage, and returns how
// long it took: connect, request, the whole body.
func get(ctx context.Context, client *http.Client, url string) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	body, err := io.ReadAll(resp.Body)
	took := time.Since(start)
	resp.Body.Close()
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK || string(body) != httpPage+"\n" {
		return 0, fmt.Errorf("GET %s: %s %q", url, resp.Status, body)
	}
	return took, nil
}

// shortName is the runtime's name in container names: cocoon, runc.
func shortName(rt string) string {
	if rt == runtimeRunc {
		return "runc"
	}
	return "cocoon"
}

// freePort is a TCP port of 127.0.0.1 that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitNoShims waits until none of c's shims runs, timeout at most: a
// shim removes its sandbox's taps and redirects before it exits.
func waitNoShims(c *harness.Containerd, timeout time.Duration) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if len(harness.ShimPIDs(c.Address))+len(harness.ShimPIDsOf(harness.RuncShimBinary, c.Address)) == 0 {
			return
		}
	}
}

// importRoot imports the root filesystem tarball root into c as a
// one-layer OCI image named ref that runs cmd.
func importRoot(c *harness.Containerd, root, ref string, cmd []string) error {
	dir, err := os.MkdirTemp("", "cocoon-bench-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	archive := filepath.Join(dir, "oci.tar")
	if err := writeOCIArchive(archive, root, ref, cmd); err != nil {
		return err
	}
	_, err = c.Ctr("images", "import", archive)
	return err
}

// writeOCIArchive writes an OCI image layout tarball at out whose one
// image, ref, has the uncompressed layer in the file layer and runs cmd.
func writeOCIArchive(out, layer, ref string, cmd []string) error {
	lf, err := os.Open(layer)
	if err != nil {
		return err
	}
	defer lf.Close()
	h := sha256.New()
	size, err := io.Copy(h, lf)
	if err != nil {
		return err
	}
	layerDigest := hex.EncodeToString(h.Sum(nil))
	desc := func(mediaType, digest string, size int64) map[string]any {
		return map[string]any{"mediaType": mediaType, "digest": "sha256:" + digest, "size": size}
	}
	blobs := map[string][]byte{}
	add := func(mediaType string, v any) map[string]any {
		b, _ := json.Marshal(v)
		sum := sha256.Sum256(b)
		d := hex.EncodeToString(sum[:])
		blobs[d] = b
		return desc(mediaType, d, int64(len(b)))
	}
	configDesc := add("application/vnd.oci.image.config.v1+json", map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{
			"Env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Cmd": cmd,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerDigest}},
	})
	manifestDesc := add("application/vnd.oci.image.manifest.v1+json", map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []any{desc("application/vnd.oci.image.layer.v1.tar", layerDigest, size)},
	})
	manifestDesc["platform"] = map[string]string{"architecture": "amd64", "os": "linux"}
	manifestDesc["annotations"] = map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": "bench"}
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{manifestDesc},
	})

	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	write := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := io.Copy(tw, r)
		return err
	}
	if err := write("oci-layout", 30, strings.NewReader(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := write("index.json", int64(len(index)), strings.NewReader(string(index))); err != nil {
		return err
	}
	names := make([]string, 0, len(blobs))
	for d := range blobs {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, d := range names {
		if err := write("blobs/sha256/"+d, int64(len(blobs[d])), strings.NewReader(string(blobs[d]))); err != nil {
			return err
		}
	}
	if _, err := lf.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := write("blobs/sha256/"+layerDigest, size, lf); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// netResults are the network figures, Cocoon next to runc.
func netResults(f netFigures) []Result {
	pair := func(name, unit string, s [2][]float64, target string) Result {
		r := median(s[1])
		return Result{Name: name, Unit: unit, Median: median(s[0]), Samples: s[0], Runc: &r, RuncSamples: s[1], Target: target}
	}
	p90 := [2][]float64{{percentile(f.get[0], 0.9)}, {percentile(f.get[1], 0.9)}}
	return []Result{
		pair("tcp host -> container (iperf3 -t 5, bridge)", "Mbit/s", f.up, ">= 300 Mbit/s (TCG)"),
		pair("tcp container -> host (iperf3 -t 5 -R, bridge)", "Mbit/s", f.down, ">= 300 Mbit/s (TCG)"),
		pair(fmt.Sprintf("http GET via 127.0.0.1:port, new conn (%d), median", httpGets), "ms", f.get, ""),
		pair("  p90 of the same GETs", "ms", p90, ""),
	}
}

// percentile is the p-quantile of s (0 < p <= 1), nearest rank.
func percentile(s []float64, p float64) float64 {
	if len(s) == 0 {
		return 0
	}
	c := append([]float64(nil), s...)
	sort.Float64s(c)
	k := int(math.Ceil(float64(len(c))*p)) - 1
	return c[max(0, min(k, len(c)-1))]
}
