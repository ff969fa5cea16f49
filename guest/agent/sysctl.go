//go:build linux

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// sysctlKey is a network sysctl as a spec names it: net.<a>.<b>... or
// net/<a>/<b>..., each part letters, digits, '_' or '-'.
var sysctlKey = regexp.MustCompile(`^net([./][A-Za-z0-9_-]+)+$`)

// takeNetworkSysctls removes from a spec without a network namespace the
// network sysctls it sets, and returns them. Such a container runs in
// the guest's own network namespace, which mirrors its sandbox's (a
// pod's): the sysctls are the sandbox's, as CRI means them for the pod's
// namespace, and the agent sets them there itself. An OCI runtime
// refuses network sysctls for a container without a network namespace
// of its own.
func (s *bundleSpec) takeNetworkSysctls() (map[string]string, error) {
	if s.linux == nil {
		return nil, nil
	}
	var namespaces []struct {
		Type string `json:"type"`
	}
	if err := s.linux.get("namespaces", &namespaces); err != nil {
		return nil, err
	}
	for _, ns := range namespaces {
		if ns.Type == "network" {
			return nil, nil
		}
	}
	var sysctl map[string]string
	if err := s.linux.get("sysctl", &sysctl); err != nil {
		return nil, err
	}
	taken := map[string]string{}
	for k, v := range sysctl {
		if strings.HasPrefix(k, "net.") || strings.HasPrefix(k, "net/") {
			if !sysctlKey.MatchString(k) || strings.ContainsAny(v, "\x00\n") {
				return nil, fmt.Errorf("linux.sysctl: %q=%q is not a network sysctl the guest can set", k, v)
			}
			taken[k] = v
			delete(sysctl, k)
		}
	}
	if len(taken) == 0 {
		return nil, nil
	}
	if err := s.linux.set("sysctl", sysctl); err != nil {
		return nil, err
	}
	return taken, nil
}

// setNetworkSysctls writes sysctls (takeNetworkSysctls') under procRoot's
// sys, in the order of their keys.
func setNetworkSysctls(ctx context.Context, procRoot, id string, sysctls map[string]string) error {
	keys := make([]string, 0, len(sysctls))
	for k := range sysctls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := filepath.Join(procRoot, "sys", strings.ReplaceAll(k, ".", "/"))
		if err := writeExisting(p, sysctls[k]); err != nil {
			return fmt.Errorf("container %s: linux.sysctl %s=%q: %w: %v", id, k, sysctls[k], errdefs.ErrInvalidArgument, err)
		}
	}
	log.G(ctx).WithField("container", id).WithField("sysctls", len(keys)).Debug("network sysctls set in the guest's namespace")
	return nil
}

// writeExisting writes v to the file p, which must exist: a sysctl the
// kernel lacks is not made.
func writeExisting(p, v string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
