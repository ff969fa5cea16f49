package hypervisor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Accel is the way guest instructions run.
type Accel string

const (
	// AccelAuto picks KVM when the host really offers hardware
	// virtualization and TCG otherwise.
	AccelAuto Accel = "auto"
	// AccelKVM runs the guest with hardware virtualization.
	AccelKVM Accel = "kvm"
	// AccelTCG emulates the guest CPU in software.
	AccelTCG Accel = "tcg"
)

// AccelHost holds the facts accelerator selection depends on. Tests fill it
// by hand; LocalAccelHost reads this machine.
type AccelHost struct {
	// CPUFlags are the flags of the first processor in /proc/cpuinfo.
	CPUFlags []string
	// KVMDevice is nil if /dev/kvm can be opened read-write.
	KVMDevice error
	// Modules are the names of loaded kernel modules (/sys/module).
	Modules []string
}

// LocalAccelHost reads the facts of this machine.
func LocalAccelHost() AccelHost {
	var h AccelHost
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		h.CPUFlags = cpuFlags(data)
	}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
		h.KVMDevice = err
	} else {
		f.Close()
	}
	if ents, err := os.ReadDir("/sys/module"); err == nil {
		for _, e := range ents {
			h.Modules = append(h.Modules, e.Name())
		}
	}
	return h
}

func cpuFlags(cpuinfo []byte) []string {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "flags" {
			return strings.Fields(v)
		}
	}
	return nil
}

// ErrNoKVM is returned when KVM is asked for by name but the host cannot
// run hardware-virtualized guests.
var ErrNoKVM = errors.New("kvm unavailable")

// SelectAccel resolves want for host h and says why.
//
// KVM is only picked when the processor exposes VT-x or AMD-V (vmx/svm) and
// /dev/kvm opens. A /dev/kvm backed by PVM (kvm_pvm loaded, no vmx/svm)
// boots only PVM-patched guest kernels, which the guest image is not, so it
// counts as no KVM.
func SelectAccel(want Accel, h AccelHost) (Accel, string, error) {
	kvmErr := h.kvmUsable()
	switch want {
	case AccelTCG:
		return AccelTCG, "configured", nil
	case AccelKVM:
		if kvmErr != nil {
			return "", "", fmt.Errorf("%w: accel = \"kvm\" but %v", ErrNoKVM, kvmErr)
		}
		return AccelKVM, "configured", nil
	case AccelAuto, "":
		if kvmErr != nil {
			return AccelTCG, kvmErr.Error() + "; using software emulation", nil
		}
		return AccelKVM, "hardware virtualization available", nil
	}
	return "", "", fmt.Errorf("unknown accelerator %q: want auto, kvm or tcg", want)
}

func (h AccelHost) kvmUsable() error {
	hw := ""
	for _, f := range h.CPUFlags {
		if f == "vmx" || f == "svm" {
			hw = f
		}
	}
	pvm := false
	for _, m := range h.Modules {
		if m == "kvm_pvm" {
			pvm = true
		}
	}
	switch {
	case hw == "" && pvm:
		return errors.New("/dev/kvm is PVM (kvm_pvm loaded, no vmx/svm), which boots only PVM guest kernels")
	case hw == "":
		return errors.New("the processor exposes no hardware virtualization (no vmx/svm flag)")
	case h.KVMDevice != nil:
		return fmt.Errorf("/dev/kvm: %v", h.KVMDevice)
	}
	return nil
}
