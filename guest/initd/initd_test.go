package initd

import (
	"strings"
	"testing"
)

func TestParseCmdline(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Cmdline
		wantErr bool
	}{
		{"", Cmdline{Channel: ChannelSerial}, false},
		{"console=ttyS0 root=/dev/vda quiet", Cmdline{Channel: ChannelSerial}, false},
		{"console=hvc0 cocoon.channel=vsock cocoon.debug=1\n", Cmdline{Channel: ChannelVsock, Debug: true}, false},
		{"cocoon.channel=serial cocoon.debug", Cmdline{Channel: ChannelSerial, Debug: true}, false},
		{"cocoon.debug=1 cocoon.debug=0", Cmdline{Channel: ChannelSerial}, false},
		{"cocoon.channel=pigeon", Cmdline{Channel: ChannelSerial}, true},
		{"cocoon.channel=vsock cocoon.debug=maybe", Cmdline{Channel: ChannelVsock}, true},
		{"xcocoon.channel=vsock cocoon.channelx=vsock", Cmdline{Channel: ChannelSerial}, false},
	} {
		got, err := ParseCmdline(tc.in)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("ParseCmdline(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParseModules(t *testing.T) {
	in := `# storage for disks added after boot
kernel/drivers/scsi/scsi_common.ko

  kernel/drivers/scsi/scsi_mod.ko.xz
kernel/drivers/scsi/./sd_mod.ko.zst
`
	got, err := ParseModules(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"kernel/drivers/scsi/scsi_common.ko", "kernel/drivers/scsi/scsi_mod.ko.xz", "kernel/drivers/scsi/sd_mod.ko.zst"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("got %v want %v", got, want)
	}
	if !compressedModule(got[1]) || compressedModule(got[0]) {
		t.Fatal("compression misdetected")
	}
	for _, bad := range []string{"/lib/modules/x.ko", "../../etc/x.ko", "kernel/../../x.ko", "kernel/readme.txt"} {
		if _, err := ParseModules(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if got, err := ParseModules(strings.NewReader("")); err != nil || len(got) != 0 {
		t.Fatalf("empty list: %v %v", got, err)
	}
}
