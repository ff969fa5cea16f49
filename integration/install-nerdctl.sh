#!/bin/bash
# install-nerdctl.sh VERSION DEST: build nerdctl at VERSION (a module
# version of github.com/containerd/nerdctl, e.g. v1.7.7) from the Go module
# proxy into DEST/bin/nerdctl, unless DEST/.version says it is there
# already. The nerdctl tests find it there (integration/harness/nerdctl.go).
#
# `go build` cannot take pkg@version and `go install` writes only into
# GOBIN, so it is built inside a throwaway module, as install-containerd.sh
# builds containerd; with nerdctl as that module's only requirement, its
# dependencies are at the versions of nerdctl's go.mod. GOFLAGS=-mod=mod
# (replacing the caller's) lets `go get` and `go build` write the
# throwaway go.sum. Without cgo, as nerdctl's own Makefile builds it.
# nerdctl 2 does not build from the proxy, hence 1.x.
set -euo pipefail
version="$1" dest="$2"
mod=github.com/containerd/nerdctl
case "$version" in
v1.*) ;;
*) echo "install-nerdctl.sh: unsupported version $version (want v1.x)" >&2; exit 2 ;;
esac
stamp="$dest/.version"
if [ -x "$dest/bin/nerdctl" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
	exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-mod=mod CGO_ENABLED=0
go mod init cocoon-test-nerdctl >/dev/null 2>&1
echo "building nerdctl $version into $dest/bin"
go get "$mod/cmd/nerdctl@$version"
go build -trimpath -ldflags "-s -w -X $mod/pkg/version.Version=$version" -o "$work/nerdctl" "$mod/cmd/nerdctl"
# Into place by rename, then the stamp: an interrupted run leaves either
# the old binary or no stamp, and the next run builds again.
mkdir -p "$dest/bin"
rm -f "$stamp"
install -m 0755 "$work/nerdctl" "$dest/bin/.nerdctl.tmp"
mv -f "$dest/bin/.nerdctl.tmp" "$dest/bin/nerdctl"
echo "$version" > "$stamp.tmp"
mv -f "$stamp.tmp" "$stamp"
"$dest/bin/nerdctl" --version
