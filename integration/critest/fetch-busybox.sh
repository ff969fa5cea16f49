#!/bin/bash
# fetch-busybox.sh DEST: Debian's busybox package (the dynamically linked
# build, not busybox-static) extracted into DEST/bin/busybox, unless
# DEST/.version says that version is there already. Nothing is installed:
# the .deb is downloaded (apt-get download, the version apt would install)
# and unpacked with dpkg-deb.
#
# The stand-in images of make critest are made of it rather than of the
# host's busybox-static: that one is built with FEATURE_SH_STANDALONE, so
# its sh runs an applet such as ls itself without executing /bin/ls, and
# a container whose /bin/ls is masked (critest's MaskedPaths spec) still
# lists its directory. This one executes /bin/ls, as the busybox image's
# does, and fails with "/bin/sh: ls: Permission denied". It needs glibc's
# shared libraries; the images carry the host's (see layer.go).
set -euo pipefail
dest="$1"
version="$(apt-cache show --no-all-versions busybox 2>/dev/null | sed -n 's/^Version: //p' | sed -n 1p)"
if [ -z "$version" ]; then
	echo "fetch-busybox.sh: apt knows no busybox package (run apt-get update)" >&2
	exit 1
fi
stamp="$dest/.version"
if [ -x "$dest/bin/busybox" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
	exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
echo "fetching Debian's busybox $version into $dest/bin"
apt-get -q -o APT::Sandbox::User=root download "busybox=$version" >/dev/null
dpkg-deb -x busybox_*.deb root
# Into place by rename, then the stamp: an interrupted run leaves either
# the old binary or no stamp, and the next run fetches again.
mkdir -p "$dest/bin"
rm -f "$stamp"
install -m 0755 root/bin/busybox "$dest/bin/.busybox.tmp"
mv -f "$dest/bin/.busybox.tmp" "$dest/bin/busybox"
echo "$version" > "$stamp.tmp"
mv -f "$stamp.tmp" "$stamp"
