#!/bin/bash
# install-docker.sh VERSION DEST: build dockerd at VERSION (a module version
# of github.com/moby/moby/v2, e.g. v2.0.0-beta.24) from the Go module proxy
# into DEST/bin/dockerd, and put Debian 12's docker CLI (package docker.io)
# beside it as DEST/bin/docker, unless DEST/.version says both are there
# already. The Docker tests find them there (integration/harness/docker.go).
#
# dockerd is built inside a throwaway module, as install-nerdctl.sh builds
# nerdctl: with moby as that module's only requirement, its dependencies
# are at the versions of moby's go.mod. Without cgo, as moby's static
# build makes it: what needs cgo (btrfs, journald, libnftables, disk
# quotas) has a stub without it, and the tests use none of it. No
# docker-proxy: the tests run dockerd with --userland-proxy=false, which
# publishes ports with iptables DNAT alone and never starts one.
#
# The CLI is the docker binary of Debian's docker.io (20.10), extracted
# from the package and not installed: installing it would bring Debian's
# own dockerd and containerd, as services that start with the machine.
set -euo pipefail
version="$1" dest="$2"
mod=github.com/moby/moby/v2
case "$version" in
v2.*) ;;
*) echo "install-docker.sh: unsupported version $version (want v2.x)" >&2; exit 2 ;;
esac
candidate() { apt-cache policy docker.io | awk '/Candidate:/ { print $2 }'; }
cli_version="$(candidate)"
if [ -z "$cli_version" ] || [ "$cli_version" = "(none)" ]; then
	# A machine whose apt lists were never fetched (make deps fetches
	# them only when it installs something).
	apt-get update -qq
	cli_version="$(candidate)"
fi
if [ -z "$cli_version" ] || [ "$cli_version" = "(none)" ]; then
	echo "install-docker.sh: no docker.io package in apt's lists, even after apt-get update" >&2
	exit 1
fi
want="$version docker.io=$cli_version"
stamp="$dest/.version"
if [ -x "$dest/bin/dockerd" ] && [ -x "$dest/bin/docker" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
	exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

echo "extracting the docker CLI of docker.io $cli_version"
# As root: apt's download user (_apt) cannot write into the mktemp
# directory, which is root's alone.
apt-get download -q -o APT::Sandbox::User=root "docker.io=$cli_version" >/dev/null
dpkg-deb -x docker.io_*.deb "$work/deb"
cli="$work/deb/usr/bin/docker"
if [ ! -x "$cli" ]; then
	echo "install-docker.sh: no usr/bin/docker in docker.io $cli_version" >&2
	exit 1
fi

export GOFLAGS=-mod=mod CGO_ENABLED=0
go mod init cocoon-test-docker >/dev/null 2>&1
echo "building dockerd $version into $dest/bin"
go get "$mod/cmd/dockerd@$version"
go build -trimpath -ldflags "-s -w -X $mod/dockerversion.Version=${version#v}" -o "$work/dockerd" "$mod/cmd/dockerd"

# Into place by rename, then the stamp: an interrupted run leaves either
# the old binaries or no stamp, and the next run installs again.
mkdir -p "$dest/bin"
rm -f "$stamp"
install -m 0755 "$work/dockerd" "$dest/bin/.dockerd.tmp"
mv -f "$dest/bin/.dockerd.tmp" "$dest/bin/dockerd"
install -m 0755 "$cli" "$dest/bin/.docker.tmp"
mv -f "$dest/bin/.docker.tmp" "$dest/bin/docker"
echo "$want" > "$stamp.tmp"
mv -f "$stamp.tmp" "$stamp"
"$dest/bin/dockerd" --version
"$dest/bin/docker" --version
