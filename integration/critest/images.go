package main

import (
	"fmt"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// standIn is one stand-in image: the names critest v1.37 pulls it by
// (more than one: tags, or registries, of the same image), what it has on
// top of the base layer, and its config.
type standIn struct {
	refs []string
	// files adds the image's own files to its layer; nil: the base layer
	// alone.
	files func(l layer)
	// user, cmd, entrypoint, env, workdir are the config's fields as the
	// original image has them.
	user       string
	entrypoint []string
	cmd        []string
	env        []string
	workdir    string
}

// The registries' prefixes of critest's images (pkg/validate/consts.go,
// pkg/framework/util.go).
const (
	e2eImages = "registry.k8s.io/e2e-test-images/"
	criTools  = "gcr.io/k8s-staging-cri-tools/"
)

// standIns are the images critest v1.37's specs pull, but the one pulled
// by digest (gcr.io/k8s-staging-cri-tools/test-image-digest@sha256:9700f9a2...):
// no stand-in can have the original's digest.
var standIns = []standIn{
	// The default image of nearly every spec: busybox's userland, users
	// and groups.
	{refs: []string{e2eImages + "busybox:1.29-2"}, cmd: []string{"sh"}},

	// The web server (networking, port forwarding) and the image the
	// HostPID, PodPID and ContainerPID specs look for as "nginx".
	{refs: []string{e2eImages + "nginx:1.14-2"}, files: nginxFiles(80),
		cmd: []string{"nginx", "-g", "daemon off;"}, env: []string{"NGINX_VERSION=1.14.2"}},
	// The host-network port forwarding spec's server: nginx on 12003.
	{refs: []string{criTools + "hostnet-nginx-" + runtime.GOARCH + ":latest"}, files: nginxFiles(12003),
		cmd: []string{"nginx", "-g", "daemon off;"}, env: []string{"NGINX_VERSION=1.25.0"}},
	// The multi-container specs' server: port 80, "httpd" in its log.
	{refs: []string{e2eImages + "httpd:2.4.39-4"}, files: httpdFiles,
		cmd: []string{"httpd-foreground"}, workdir: "/usr/local/apache2",
		env: []string{"HTTPD_PREFIX=/usr/local/apache2"}},
	// The NoNewPrivs specs' setuid-root program.
	{refs: []string{e2eImages + "nonewprivs:1.3"}, files: nnpFiles,
		entrypoint: []string{"/usr/local/bin/nnp"}},
	// The same image under two registries' names (its id must be one).
	{refs: []string{"registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9"}, files: pauseFiles,
		entrypoint: []string{"/pause"}, user: "65535:65535"},

	// Image Manager specs: busybox:1.37.0 with a file named after the
	// image (images/image-test in cri-tools), one image per name.
	testImage("test-image-1", "latest"),
	testImage("test-image-2", "latest"),
	testImage("test-image-3", "latest"),
	testImage("test-image-latest", "latest"),
	testImage("test-image-tag", "test"),
	testImage("test-image-tag", "all"),
	// Three tags of one image.
	{refs: []string{criTools + "test-image-tags:1", criTools + "test-image-tags:2", criTools + "test-image-tags:3"},
		files: emptyFile("same-image"), cmd: []string{"sh"}},

	// Image user specs: busybox:1.37.0 with USER set (images/image-user).
	{refs: []string{criTools + "test-image-user-uid:latest"}, user: "1002", cmd: []string{"sh"}},
	{refs: []string{criTools + "test-image-user-username:latest"}, user: "www-data", cmd: []string{"sh"}},
	{refs: []string{criTools + "test-image-user-uid-group:latest"}, user: "1003:1004", cmd: []string{"sh"}},
	{refs: []string{criTools + "test-image-user-username-group:latest"}, user: "www-data:1004", cmd: []string{"sh"}},
	// SupplementalGroupsPolicy and image volume specs
	// (images/image-predefined-group): default-user (1000) in
	// group-defined-in-image (50000) in /etc/group.
	{refs: []string{criTools + "test-image-predefined-group:latest"}, files: predefinedGroupFiles,
		user: "1000", cmd: []string{"sh"}},
}

// offlineOnly is what critest pulls that no stand-in can be: an image by
// the digest of the original's manifest.
var offlineOnly = []string{
	criTools + "test-image-digest@sha256:9700f9a2f5bf2c45f2f605a0bd3bce7cf37420ec9d3ed50ac2758413308766bf",
}

func testImage(name, tag string) standIn {
	file := name
	if name == "test-image-tag" {
		file = tag
	}
	return standIn{refs: []string{criTools + name + ":" + tag}, files: emptyFile(file), cmd: []string{"sh"}}
}

// emptyFile is Docker's `ADD name name` of an empty file: /name.
func emptyFile(name string) func(layer) {
	return func(l layer) { l.file(name, 0o644, nil) }
}

// nginxFiles are the nginx image's: the server as /usr/sbin/nginx, the
// port in its conf.d, and a page at the root.
func nginxFiles(port int) func(layer) {
	return func(l layer) {
		for _, d := range []string{"etc/nginx", "etc/nginx/conf.d", "usr/share/nginx", "usr/share/nginx/html"} {
			l.dir(d, 0o755)
		}
		l.symlink("usr/sbin/nginx", "/bin/standin")
		l.file("etc/nginx/conf.d/default.conf", 0o644, fmt.Appendf(nil,
			"server {\n    listen       %d;\n    server_name  localhost;\n    location / {\n        root   /usr/share/nginx/html;\n    }\n}\n", port))
		l.file("usr/share/nginx/html/index.html", 0o644, []byte("<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n<body><h1>Welcome to nginx!</h1></body></html>\n"))
	}
}

func httpdFiles(l layer) {
	for _, d := range []string{"usr/local/apache2", "usr/local/apache2/htdocs"} {
		l.dir(d, 0o755)
	}
	l.symlink("usr/local/bin/httpd-foreground", "/bin/standin")
	l.file("usr/local/apache2/htdocs/index.html", 0o644, []byte("<html><body><h1>It works!</h1></body></html>\n"))
}

// nnpFiles: a copy of the standin of its own (the setuid bit is the
// inode's) as /usr/local/bin/nnp, setuid root; the standin picks the
// program by that name.
func nnpFiles(l layer) {
	si := l["bin/standin"]
	l.file("usr/local/bin/nnp", 0o4755, si.data)
}

func pauseFiles(l layer) { l.symlink("pause", "/bin/standin") }

func predefinedGroupFiles(l layer) {
	// busybox's `adduser -u 1000 -D default-user && addgroup -g 50000
	// group-defined-in-image && addgroup default-user group-defined-in-image`.
	l.file("etc/passwd", 0o644, []byte(busyboxPasswd+"default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n"))
	l.file("etc/group", 0o644, []byte(busyboxGroup+"default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n"))
	l["home/default-user"] = entry{typ: dirType, mode: 0o755, uid: 1000, gid: 1000}
}

// builtImage is a stand-in made: its names and the image.
type builtImage struct {
	refs []string
	img  v1.Image
}

// buildImages makes every stand-in: the base layer (shared: one blob),
// and each image's files as a second layer.
func buildImages(busybox, standin string) ([]builtImage, error) {
	base, err := baseLayer(busybox, standin)
	if err != nil {
		return nil, err
	}
	baseBlob, err := base.build()
	if err != nil {
		return nil, err
	}
	var out []builtImage
	for _, s := range standIns {
		layers := []v1.Layer{baseBlob}
		if s.files != nil {
			own := s.ownFiles(base)
			l, err := own.build()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.refs[0], err)
			}
			layers = append(layers, l)
		}
		img, err := s.image(layers)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.refs[0], err)
		}
		out = append(out, builtImage{refs: s.refs, img: img})
	}
	return out, nil
}

// ownFiles is what s.files adds to or changes in base, with the
// directories above them that base lacks. files sees base's entries
// (nnpFiles copies the standin's).
func (s standIn) ownFiles(base layer) layer {
	view := layer{}
	for k, v := range base {
		view[k] = v
	}
	s.files(view)
	own := layer{}
	for k, v := range view {
		if b, ok := base[k]; !ok || !sameEntry(b, v) {
			own[k] = v
		}
	}
	for k := range own {
		own.parentDirs(k, base)
	}
	return own
}

func sameEntry(a, b entry) bool {
	return a.typ == b.typ && a.mode == b.mode && a.uid == b.uid && a.gid == b.gid &&
		a.link == b.link && string(a.data) == string(b.data)
}

// image is the OCI image of the layers with s's config.
func (s standIn) image(layers []v1.Layer) (v1.Image, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Created:      v1.Time{Time: epoch},
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			User:       s.user,
			Entrypoint: s.entrypoint,
			Cmd:        s.cmd,
			Env:        append([]string{usrPath}, s.env...),
			WorkingDir: s.workdir,
		},
	})
	if err != nil {
		return nil, err
	}
	return mutate.AppendLayers(img, layers...)
}
