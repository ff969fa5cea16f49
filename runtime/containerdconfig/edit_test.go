package containerdconfig

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

const mainPath = "/etc/containerd/config.toml"

func files(main string) Files {
	return Files{Path: mainPath, Main: File{Exists: true, Data: []byte(main)}}
}

// roundTrip installs into f, checks that a second install changes
// nothing, uninstalls, and checks that f comes back byte for byte. It
// returns what install made.
func roundTrip(t *testing.T, f Files, major int) Files {
	t.Helper()
	in, note, err := Install(f, major)
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	if note == "" || in.Equal(f) {
		t.Fatalf("Install changed nothing (note %q)", note)
	}
	again, note2, err := Install(in, major)
	if err != nil || !again.Equal(in) || note2 != "" {
		t.Fatalf("a second Install: changed %v, note %q, err %v; want no change", !again.Equal(in), note2, err)
	}
	out, note, err := Uninstall(in)
	if err != nil {
		t.Fatalf("Uninstall: %v", err)
	}
	if !out.Equal(f) {
		t.Fatalf("Uninstall (%s) left\n%s\nwant\n%s", note, out.Main.Data, f.Main.Data)
	}
	if again, note, err := Uninstall(out); err != nil || !again.Equal(out) || note != "" {
		t.Fatalf("a second Uninstall: note %q, err %v; want no change", note, err)
	}
	return in
}

// TestInstallVersion2 appends the handler's table to a version 2 file
// (containerd 1.6, 1.7), comments and a missing final newline and all,
// and takes exactly that away again.
func TestInstallVersion2(t *testing.T) {
	const main = `# Site settings.
version = 2
imports = ["site.toml"] # kept

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.example/pause:3.9" # our mirror
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"`
	in := roundTrip(t, files(main), 1)
	got := string(in.Main.Data)
	if !strings.HasPrefix(got, main+"\n") || !strings.HasSuffix(got, blockEnd+"\n") || in.DropIn.Exists {
		t.Fatalf("Install made\n%s\nand a drop-in %v; want the file with the block appended and no drop-in", got, in.DropIn.Exists)
	}
	if !strings.Contains(got, Tables(LayoutV2)) {
		t.Fatalf("the block lacks Tables(LayoutV2):\n%s", got)
	}
}

// TestInstallVersion2DefaultRuntime: to a file that defines no runtime
// the block adds runc as containerd 1.x's defaults have it, since 1.x
// would drop it; to one that defines runtimes, the handler alone.
func TestInstallVersion2DefaultRuntime(t *testing.T) {
	for _, tc := range []struct {
		main string
		runc bool
	}{
		{"version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n", true},
		{"version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\n", true},
		{"version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata]\n  runtime_type = \"io.containerd.kata.v2\"\n", false},
	} {
		in := roundTrip(t, files(tc.main), 1)
		if got := strings.Contains(string(in.Main.Data), defaultRuntimeV2); got != tc.runc {
			t.Errorf("%q: the block has runc: %v, want %v", tc.main, got, tc.runc)
		}
	}
}

// TestInstallVersion3 writes the drop-in and adds it to the imports, in
// each form the imports take.
func TestInstallVersion3(t *testing.T) {
	const q = `"/etc/containerd/conf.d/cocoon.toml"`
	for _, tc := range []struct{ name, main, want string }{
		{
			name: "no imports",
			main: "version = 3\nroot = \"/var/lib/containerd\"\n\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = 'registry.example/pause:3.9'\n",
			want: "version = 3\nimports = [" + q + "] " + importComment + "\nroot",
		},
		{
			name: "no imports, no final newline",
			main: "# just the version\nversion = 3",
			want: "version = 3\nimports = [" + q + "] " + importComment,
		},
		{
			name: "empty imports",
			main: "version = 3\nimports = []\n",
			want: "imports = [" + q + "]\n",
		},
		{
			name: "imports over lines, with comments",
			main: "version = 3\n# site first\nimports = [ # the site's\n  \"site.toml\",\n  '/etc/containerd/other.toml', # and another\n]\noom_score = -999\n",
			want: "imports = [" + q + ",  # the site's\n  \"site.toml\",",
		},
		{
			name: "version 4 (containerd 2.4)",
			main: "version = 4\nimports = ['/opt/site/*.toml']\n",
			want: "imports = [" + q + ", '/opt/site/*.toml']\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := roundTrip(t, files(tc.main), 2)
			if got := string(in.Main.Data); !strings.Contains(got, tc.want) {
				t.Fatalf("Install made\n%s\nwant it to hold\n%s", got, tc.want)
			}
			if !in.DropIn.Exists || string(in.DropIn.Data) != string(dropIn()) {
				t.Fatalf("drop-in %q, want %q", in.DropIn.Data, dropIn())
			}
		})
	}
}

// TestInstallImportCovered: an import that already takes the drop-in
// (containerd 2.4's default conf.d/*.toml, relative or not) leaves the
// main file as it is.
func TestInstallImportCovered(t *testing.T) {
	for _, imp := range []string{"/etc/containerd/conf.d/*.toml", "conf.d/*.toml", "./conf.d/cocoon.toml"} {
		f := files("version = 4\nimports = ['" + imp + "']\n")
		in := roundTrip(t, f, 2)
		if string(in.Main.Data) != string(f.Main.Data) || !in.DropIn.Exists {
			t.Errorf("imports %s: main\n%s\ndrop-in %v; want the main file unchanged and the drop-in", imp, in.Main.Data, in.DropIn.Exists)
		}
	}
}

// TestInstallMissing: without a main file, Install makes one of the
// version containerd's major reads, and Uninstall removes it.
func TestInstallMissing(t *testing.T) {
	for _, tc := range []struct {
		major   int
		version string
		dropIn  bool
	}{{1, "version = 2\n", false}, {2, "version = 3\n", true}} {
		in := roundTrip(t, Files{Path: mainPath}, tc.major)
		if got := string(in.Main.Data); !strings.HasPrefix(got, createdHeader+tc.version) || in.DropIn.Exists != tc.dropIn {
			t.Errorf("containerd %d.x: made\n%s\ndrop-in %v", tc.major, got, in.DropIn.Exists)
		}
	}
	if _, _, err := Install(Files{Path: mainPath}, 0); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Install of a missing file for an unknown containerd: %v, want an invalid argument", err)
	}
}

// TestInstallUpdatesBlock: a block of another release is replaced by
// this one's, and what the user added after it stays.
func TestInstallUpdatesBlock(t *testing.T) {
	const main = "version = 2\n"
	in, _, err := Install(files(main), 1)
	if err != nil {
		t.Fatal(err)
	}
	old := strings.Replace(string(in.Main.Data), "privileged_without_host_devices = true", "privileged_without_host_devices = false", 1)
	const later = "\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n"
	up, note, err := Install(files(old+later), 1)
	if err != nil || !strings.HasPrefix(note, "updated") {
		t.Fatalf("Install over an old block: note %q, err %v", note, err)
	}
	if string(up.Main.Data) != string(in.Main.Data)+later || note != "updated the runtime cocoon in "+mainPath {
		t.Fatalf("updated to\n%s", up.Main.Data)
	}
	out, _, err := Uninstall(up)
	if err != nil || string(out.Main.Data) != main+later {
		t.Fatalf("Uninstall: %v\n%s", err, out.Main.Data)
	}
}

// TestInstallRefuses: files Install must not touch, and handlers it
// leaves alone.
func TestInstallRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, main string
		major      int
		is         func(error) bool
	}{
		{"version 1", "root = \"/var/lib/containerd\"\n", 1, errdefs.IsNotImplemented},
		{"version 5", "version = 5\n", 2, errdefs.IsNotImplemented},
		{"version 3 for containerd 1.x", "version = 3\n", 1, errdefs.IsFailedPrecondition},
		{"cri disabled", "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n", 1, errdefs.IsFailedPrecondition},
		{"not toml", "version = 2\n[plugins\n", 1, errdefs.IsInvalidArgument},
		{"runtimes inline", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  runtimes = { runc = { runtime_type = \"io.containerd.runc.v2\" } }\n", 1, errdefs.IsFailedPrecondition},
		{"block without end", "version = 2\n\n" + blockBegin + "\n", 1, errdefs.IsFailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := files(tc.main)
			if _, _, err := Install(f, tc.major); !tc.is(err) {
				t.Fatalf("Install: %v", err)
			}
		})
	}
	t.Run("drop-in not ours", func(t *testing.T) {
		f := files("version = 3\n")
		f.DropIn = File{Exists: true, Data: []byte("version = 3\n")}
		if _, _, err := Install(f, 2); !errdefs.IsAlreadyExists(err) {
			t.Fatalf("Install: %v", err)
		}
		if out, note, err := Uninstall(f); err != nil || !out.Equal(f) || note != "" {
			t.Fatalf("Uninstall took %q away (%v)", note, err)
		}
	})
	for _, main := range []string{
		"version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.cocoon]\n  runtime_type = \"io.containerd.cocoon.v2\"\n",
		"version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.cocoon]\n  runtime_type = 'io.containerd.cocoon.v2'\n",
	} {
		f := files(main)
		out, note, err := Install(f, 0)
		if err != nil || !out.Equal(f) || !strings.Contains(note, "left as it is") {
			t.Errorf("Install over a hand-made handler: note %q, err %v, changed %v", note, err, !out.Equal(f))
		}
		if out, note, err := Uninstall(f); err != nil || !out.Equal(f) || note != "" {
			t.Errorf("Uninstall of a hand-made handler: note %q, err %v", note, err)
		}
	}
}

// TestUninstallKeepsUserEdits: the user's own imports, added after the
// install, stay.
func TestUninstallKeepsUserEdits(t *testing.T) {
	in, _, err := Install(files("version = 3\n"), 2)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(in.Main.Data), "] "+importComment, ", \"site.toml\"] "+importComment, 1)
	in.Main.Data = []byte(edited)
	out, _, err := Uninstall(in)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out.Main.Data), "version = 3\nimports = [\"site.toml\"] "+importComment+"\n"; got != want || out.DropIn.Exists {
		t.Fatalf("Uninstall left\n%s\nwant\n%s", got, want)
	}
}
