// Command standin is the one static binary behind the programs the
// stand-in critest images run that Debian's busybox-static does not have,
// chosen by the name it is called by (as busybox is):
//
//	nginx            a static web server as the nginx images are seen by the
//	                 specs: it listens on the port of the "listen" directive
//	                 in /etc/nginx/conf.d/*.conf (80 without one), serves
//	                 /usr/share/nginx/html, writes /var/run/nginx.pid and
//	                 shows itself as "nginx: master process ..."
//	httpd-foreground the httpd image's server: port 80, /usr/local/apache2/htdocs,
//	                 Apache's start-up lines on stderr
//	pause            the pause image: waits for SIGINT or SIGTERM, reaps children
//	nnp              the nonewprivs image's program (installed setuid root):
//	                 prints "Effective uid: N"
//	pgrep, ipcs      the busybox applets of those names, as far as the specs
//	                 use them
package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	name := filepath.Base(os.Args[0])
	if strings.HasPrefix(name, "nginx") {
		name = "nginx"
	}
	args := os.Args[1:]
	if name == "standin" && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	var err error
	switch name {
	case "nginx":
		err = nginx()
	case "httpd-foreground", "httpd":
		err = httpd()
	case "pause":
		pause()
	case "nnp":
		fmt.Printf("Effective uid: %d\n", os.Geteuid())
	case "pgrep":
		os.Exit(pgrep(args))
	case "ipcs":
		err = ipcs(args)
	default:
		err = fmt.Errorf("unknown program %q", name)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// nginxTitle is what nginx's master process shows as its command line.
const nginxTitle = "nginx: master process nginx -g daemon off;"

// nginx runs the web server. It first executes itself again with argv[0]
// set to the master's title (the same pid: /proc/PID/cmdline then reads as
// nginx's). It executes the name it was started by, /usr/sbin/nginx, not
// the file that name links to: the kernel names the process (what pidof
// matches) after the path executed.
func nginx() error {
	if os.Args[0] != nginxTitle {
		exe, err := exec.LookPath(os.Args[0])
		if err != nil {
			return err
		}
		return syscall.Exec(exe, []string{nginxTitle}, os.Environ())
	}
	port, err := nginxPort("/etc/nginx/conf.d")
	if err != nil {
		return err
	}
	if err := os.WriteFile("/var/run/nginx.pid", []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	return serve(":"+port, "/usr/share/nginx/html")
}

// listenRe is nginx's listen directive with a bare port.
var listenRe = regexp.MustCompile(`(?m)^\s*listen\s+(\d+)\s*;`)

// nginxPort is the first port a "listen" directive of dir's *.conf files
// names, 80 if none does.
func nginxPort(dir string) (string, error) {
	confs, err := filepath.Glob(filepath.Join(dir, "*.conf"))
	if err != nil {
		return "", err
	}
	for _, c := range confs {
		data, err := os.ReadFile(c)
		if err != nil {
			return "", err
		}
		if m := listenRe.FindSubmatch(data); m != nil {
			return string(m[1]), nil
		}
	}
	return "80", nil
}

// httpd runs the httpd image's server, saying so on stderr as Apache does
// (the multi-container spec looks for "httpd" in its log).
func httpd() error {
	fmt.Fprintln(os.Stderr, "AH00558: httpd: Could not reliably determine the server's fully qualified domain name")
	fmt.Fprintln(os.Stderr, "[mpm_event:notice] AH00489: Apache/2.4.39 (Unix) configured -- resuming normal operations")
	return serve(":80", "/usr/local/apache2/htdocs")
}

// serve serves the files of root on addr until SIGTERM, SIGINT or SIGQUIT
// (nginx's graceful stop), then exits 0.
func serve(addr, root string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT)
	go func() {
		<-sigs
		os.Exit(0)
	}()
	return http.Serve(l, http.FileServer(http.Dir(root)))
}

// pause waits for SIGINT or SIGTERM and reaps the children it inherits.
func pause() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// pgrep prints the pids of the processes whose name (or, with -f, whole
// command line) matches the pattern, one a line, and returns 0 if there
// was one, 1 if not: busybox's pgrep with -f and -x.
func pgrep(args []string) int {
	full, exact := false, false
	var pattern string
	for _, a := range args {
		switch {
		case a == "-f":
			full = true
		case a == "-x":
			exact = true
		case strings.HasPrefix(a, "-"):
			fmt.Fprintf(os.Stderr, "pgrep: unsupported option %s\n", a)
			return 2
		default:
			pattern = a
		}
	}
	if exact {
		pattern = "^(" + pattern + ")$"
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgrep: %v\n", err)
		return 2
	}
	ents, _ := os.ReadDir("/proc")
	status := 1
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var subject string
		if full {
			b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			subject = strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ")
		} else {
			b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
			subject = strings.TrimSpace(string(b))
		}
		if subject != "" && re.MatchString(subject) {
			fmt.Println(pid)
			status = 0
		}
	}
	return status
}

// ipcs prints the System V shared memory segments of the IPC namespace
// (-m, the default), from /proc/sysvipc/shm, in busybox's format.
func ipcs(args []string) error {
	for _, a := range args {
		if a != "-m" {
			return fmt.Errorf("unsupported option %s (only -m)", a)
		}
	}
	f, err := os.Open("/proc/sysvipc/shm")
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Printf("\n------ Shared Memory Segments --------\n")
	fmt.Printf("%-10s %-10s %-10s %-10s %-10s %-10s %-12s\n", "key", "shmid", "owner", "perms", "bytes", "nattch", "status")
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// key shmid perms size cpid lpid nattch uid ...
		fl := strings.Fields(sc.Text())
		if len(fl) < 8 {
			continue
		}
		key, _ := strconv.ParseInt(fl[0], 10, 64)
		fmt.Printf("0x%08x %-10s %-10s %-10s %-10s %-10s\n", uint32(key), fl[1], fl[7], fl[2], fl[3], fl[6])
	}
	return sc.Err()
}
