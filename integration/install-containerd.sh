#!/bin/bash
# install-containerd.sh VERSION DEST: build containerd, ctr and the runc
# shim (containerd-shim-runc-v2) at VERSION (a module version, e.g. v1.7.30
# or v2.4.2) from the Go module proxy into DEST/bin, unless they are there
# already. The integration tests run every containerd they find there next
# to Debian's 1.6; containerd finds the runc shim there first on its PATH
# (a 2.x containerd cannot start Debian's 1.6 one), built static as
# containerd builds its shims.
#
# containerd 1.7's go.mod has exclude directives, which `go install
# pkg@version` refuses, so both are built inside a throwaway module.
set -euo pipefail
version="$1" dest="$2"
case "$version" in
v1.*) mod=github.com/containerd/containerd ;;
v2.*) mod=github.com/containerd/containerd/v2 ;;
*) echo "install-containerd.sh: unknown version $version" >&2; exit 2 ;;
esac
if [ -x "$dest/bin/containerd" ] && [ -x "$dest/bin/containerd-shim-runc-v2" ] && "$dest/bin/containerd" --version 2>/dev/null | grep -qF " ${version} "; then
	exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init cocoon-test-containerd >/dev/null 2>&1
echo "building containerd $version into $dest/bin"
go get "$mod/cmd/containerd@$version" "$mod/cmd/ctr@$version" "$mod/cmd/containerd-shim-runc-v2@$version"
mkdir -p "$dest/bin"
CGO_ENABLED=0 go build -trimpath -ldflags "-X $mod/version.Version=$version" -o "$dest/bin/containerd-shim-runc-v2" "$mod/cmd/containerd-shim-runc-v2"
for cmd in ctr containerd; do
	go build -trimpath -ldflags "-X $mod/version.Version=$version" -o "$dest/bin/$cmd" "$mod/cmd/$cmd"
done
"$dest/bin/containerd" --version
