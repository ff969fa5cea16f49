package checkpoint

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
)

// Describe writes a summary of the checkpoint for a person: what was
// saved, the machine and guest image a restore needs, the containers with
// their processes, the disks, and the files with their sizes. Strings
// that are not plain are quoted, so that a hand-edited manifest cannot
// drive the terminal.
func (m *Manifest) Describe(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	mc := m.Machine
	fmt.Fprintf(tw, "format:\t%d\n", m.Format)
	fmt.Fprintf(tw, "created:\t%s\n", m.Created.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "sandbox:\t%s/%s\n", Show(m.Namespace), Show(m.SandboxID))
	fmt.Fprintf(tw, "machine:\t%s %s, %s, %d vCPUs, %d MiB, accel %s, channel %s\n",
		Show(mc.Driver), Show(mc.DriverVersion), Show(mc.MachineType), mc.VCPUs, mc.MemoryMiB, Show(mc.Accel), Show(mc.Channel))
	fmt.Fprintf(tw, "kernel args:\t%s\n", ShowList(mc.KernelArgs))
	fmt.Fprintf(tw, "devices:\t%s\n", ShowList(mc.Devices))
	fmt.Fprintf(tw, "guest image:\t%s, kernel %s, initrd %s\n", Show(m.Guest.Version), Show(m.Guest.Kernel), Show(m.Guest.Initrd))
	fmt.Fprintf(tw, "vmm state:\t%s\n", Show(m.State))
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "containers: %d\n", len(m.Containers))
	for _, c := range m.Containers {
		fmt.Fprintf(w, "  %s: %s\n", Show(c.ID), count(len(c.Processes), "process", "processes"))
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, p := range c.Processes {
			what := "init"
			if p.ExecID != "" {
				what = "exec " + Show(p.ExecID)
			}
			fmt.Fprintf(tw, "    %s\tguest %s\tpid %d\t%s\n", what, Show(p.GuestID), p.Pid, stdio(p))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintf(w, "disks: %d\n", len(m.Disks))
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, d := range m.Disks {
		mode := "read-write"
		if d.ReadOnly {
			mode = "read-only"
		}
		what := Show(d.Digest)
		if d.Role == RoleScratch {
			what = fmt.Sprintf("%s nominal, in file %s", sizeOf(d.Size), Show(d.File))
		}
		fmt.Fprintf(tw, "  %s\tscsi %d:%d\t%s\t%s\tcontainer %s\t%s\n",
			Show(d.ID), d.Addr.SCSIID, d.Addr.LUN, Show(d.Role), mode, Show(d.Container), what)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "files: %d\n", len(m.Files))
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	var total int64
	for _, f := range m.Files {
		total += f.Size
		fmt.Fprintf(tw, "  %s\t%s\tsha256 %s\n", Show(f.Name), sizeOf(f.Size), Show(f.SHA256))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "total: %s in %s and the manifest\n", sizeOf(total), count(len(m.Files), "file", "files"))
	return err
}

// stdio says which of a process's streams are connected.
func stdio(p Process) string {
	var s []string
	for _, f := range []struct {
		on   bool
		name string
	}{{p.Terminal, "terminal"}, {p.Stdin, "stdin"}, {p.Stdout, "stdout"}, {p.Stderr, "stderr"}} {
		if f.on {
			s = append(s, f.name)
		}
	}
	if len(s) == 0 {
		return "no stdio"
	}
	return strings.Join(s, " ")
}

// Show returns s as it is if it is plain (printable, no spaces, not
// empty), else quoted: manifests are read back, and a hand-edited one
// must not drive the terminal of whoever looks at it.
func Show(s string) string {
	if s == "" {
		return `""`
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) || r == '"' {
			return strconv.Quote(s)
		}
	}
	return s
}

// ShowList shows each element of l, "none" if there are none.
func ShowList(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = Show(e)
	}
	return strings.Join(s, " ")
}

// sizeOf shows n bytes, and in the largest binary unit that keeps it at
// least 1 when that is not bytes.
func sizeOf(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	v, u := float64(n), 0
	for v >= unit && u < 5 {
		v /= unit
		u++
	}
	return fmt.Sprintf("%d bytes (%.1f %ciB)", n, v, "KMGTP"[u-1])
}

// count is n of what is counted, singular or plural.
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
