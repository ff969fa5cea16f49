package portfwd

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/cocoonrt/cocoon/runtime/network"
)

// ruleComment marks the forwarder's rules in the namespace's iptables.
const ruleComment = "cocoon port-forward"

// errNoLoopback is a namespace without the family's loopback address.
var errNoLoopback = fmt.Errorf("no loopback address: %w", errdefs.ErrNotFound)

// family is the forwarding of one address family's loopback: its
// listener in the namespace and the rule that sends it every connection.
type family struct {
	// ipv6 is ::1's family; else 127.0.0.1's.
	ipv6 bool
	// ln is the listener, on the loopback address, in the namespace.
	ln *net.TCPListener
	// iptables is the command of the family's rules, resolved.
	iptables string
	// rule is the rule's specification, after the chain.
	rule []string
	// added is set once the rule is in the namespace.
	added bool
}

func (fam *family) String() string {
	if fam.ipv6 {
		return "IPv6"
	}
	return "IPv4"
}

// loopback is the family's loopback address.
func (fam *family) loopback() net.IP {
	if fam.ipv6 {
		return net.IPv6loopback
	}
	return net.IPv4(127, 0, 0, 1)
}

// setUp makes the family's listener in the namespace entered through
// nsPath and adds its rule there, with the iptables command cmd. On
// error nothing is left.
func (fam *family) setUp(nsPath, cmd string) (retErr error) {
	path, err := exec.LookPath(cmd)
	if err != nil {
		return fmt.Errorf("%s not found (%v): %w", cmd, err, errdefs.ErrNotFound)
	}
	fam.iptables = path
	proto := "tcp4"
	if fam.ipv6 {
		proto = "tcp6"
	}
	err = network.InNamespace(nsPath, func() (err error) {
		fam.ln, err = net.ListenTCP(proto, &net.TCPAddr{IP: fam.loopback()})
		return err
	})
	if err != nil {
		if errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.EAFNOSUPPORT) {
			return fmt.Errorf("the namespace has no %s (is lo up?): %w", fam.loopback(), errNoLoopback)
		}
		return fmt.Errorf("listen on %s in the namespace: %w", fam.loopback(), err)
	}
	defer func() {
		if retErr != nil {
			_ = fam.ln.Close()
		}
	}()
	port := strconv.Itoa(fam.ln.Addr().(*net.TCPAddr).Port)
	fam.rule = []string{"-o", "lo", "-p", "tcp", "-d", fam.loopback().String(), "!", "--dport", port,
		"-m", "comment", "--comment", ruleComment, "-j", "REDIRECT", "--to-ports", port}
	if err := fam.iptablesRun(nsPath, "-A"); err != nil {
		return err
	}
	fam.added = true
	return nil
}

// remove removes the family's rule, if it was added, and closes its
// listener. A rule that is no longer there is not an error.
func (fam *family) remove(nsPath string) error {
	var errs []error
	if fam.added {
		if err := fam.iptablesRun(nsPath, "-D"); err != nil {
			var exit *exec.ExitError
			// -C exits 1 when the rule is not there (someone removed it,
			// or flushed the table).
			if cerr := fam.iptablesRun(nsPath, "-C"); !errors.As(cerr, &exit) || exit.ExitCode() != 1 {
				errs = append(errs, err)
			}
		}
		fam.added = false
	}
	if fam.ln != nil {
		if err := fam.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// iptablesRun runs the family's iptables with op (-A, -D, -C) on its rule
// in the nat table's OUTPUT chain, in the namespace.
func (fam *family) iptablesRun(nsPath, op string) error {
	args := append([]string{"-w", "5", "-t", "nat", op, "OUTPUT"}, fam.rule...)
	var out bytes.Buffer
	err := network.InNamespace(nsPath, func() error {
		cmd := exec.Command(fam.iptables, args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		return cmd.Run()
	})
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", fam.iptables, strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}
