package hypervisor

import (
	"errors"
	"strings"
	"testing"
)

func TestSelectAccel(t *testing.T) {
	vmx := []string{"fpu", "vmx", "sse2"}
	plain := []string{"fpu", "hypervisor", "sse2"}
	cases := []struct {
		name      string
		want      Accel
		host      AccelHost
		got       Accel
		reason    string
		errIs     error
		errSubstr string
	}{
		{name: "auto with vt-x", want: AccelAuto, host: AccelHost{CPUFlags: vmx}, got: AccelKVM},
		{name: "auto with amd-v", want: AccelAuto, host: AccelHost{CPUFlags: []string{"svm"}}, got: AccelKVM},
		{name: "auto on pvm", want: AccelAuto, host: AccelHost{CPUFlags: plain, Modules: []string{"kvm", "kvm_pvm"}}, got: AccelTCG, reason: "PVM"},
		{name: "auto without hw virt", want: AccelAuto, host: AccelHost{CPUFlags: plain}, got: AccelTCG, reason: "no vmx/svm"},
		{name: "auto with vmx but no device", want: AccelAuto, host: AccelHost{CPUFlags: vmx, KVMDevice: errors.New("permission denied")}, got: AccelTCG, reason: "permission denied"},
		{name: "empty means auto", want: "", host: AccelHost{CPUFlags: vmx}, got: AccelKVM},
		{name: "tcg forced", want: AccelTCG, host: AccelHost{CPUFlags: vmx}, got: AccelTCG},
		{name: "kvm forced on pvm", want: AccelKVM, host: AccelHost{CPUFlags: plain, Modules: []string{"kvm_pvm"}}, errIs: ErrNoKVM, errSubstr: "PVM"},
		{name: "kvm forced with hw", want: AccelKVM, host: AccelHost{CPUFlags: vmx}, got: AccelKVM},
		{name: "unknown", want: "hvf", host: AccelHost{}, errSubstr: `"hvf"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, why, err := SelectAccel(tc.want, tc.host)
			if tc.errSubstr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errSubstr) || (tc.errIs != nil && !errors.Is(err, tc.errIs)) {
					t.Fatalf("err = %v, want one containing %q", err, tc.errSubstr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.got || !strings.Contains(why, tc.reason) || why == "" {
				t.Fatalf("got %s (%q), want %s with reason containing %q", got, why, tc.got, tc.reason)
			}
		})
	}
}

func TestCPUFlags(t *testing.T) {
	info := []byte("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu vme svm lm\n\nprocessor\t: 1\nflags\t\t: fpu\n")
	got := cpuFlags(info)
	if strings.Join(got, " ") != "fpu vme svm lm" {
		t.Fatalf("cpuFlags = %v", got)
	}
}
