#!/bin/bash
# install-cri-tools.sh VERSION DEST: build crictl and critest of
# sigs.k8s.io/cri-tools at VERSION (a module version, e.g. v1.37.0) from
# the Go module proxy into DEST/bin, unless DEST/.version says they are
# there already. The CRI tests find them there (integration/harness/crictl.go).
#
# As install-nerdctl.sh does, inside a throwaway module whose only
# requirement is cri-tools, so that the dependencies are at the versions of
# cri-tools' go.mod. crictl is a main package; critest is the test binary
# of cmd/critest (ginkgo specs compiled with `go test -c`), as cri-tools'
# own Makefile builds them: without cgo, the version linked in without its
# leading v.
set -euo pipefail
version="$1" dest="$2"
mod=sigs.k8s.io/cri-tools
case "$version" in
v1.*) ;;
*) echo "install-cri-tools.sh: unsupported version $version (want v1.x)" >&2; exit 2 ;;
esac
stamp="$dest/.version"
if [ -x "$dest/bin/crictl" ] && [ -x "$dest/bin/critest" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
	exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-mod=mod CGO_ENABLED=0
go mod init cocoon-test-cri-tools >/dev/null 2>&1
echo "building crictl and critest $version into $dest/bin"
go get "$mod@$version"
ldflags="-s -w -X $mod/pkg/version.Version=${version#v}"
go build -trimpath -ldflags "$ldflags" -o "$work/crictl" "$mod/cmd/crictl"
go test -c -trimpath -ldflags "$ldflags" -o "$work/critest" "$mod/cmd/critest"
# Into place by rename, then the stamp: an interrupted run leaves either
# the old binaries or no stamp, and the next run builds again.
mkdir -p "$dest/bin"
rm -f "$stamp"
for b in crictl critest; do
	install -m 0755 "$work/$b" "$dest/bin/.$b.tmp"
	mv -f "$dest/bin/.$b.tmp" "$dest/bin/$b"
done
echo "$version" > "$stamp.tmp"
mv -f "$stamp.tmp" "$stamp"
"$dest/bin/crictl" --version
"$dest/bin/critest" --version
