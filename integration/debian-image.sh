#!/bin/bash
# debian-image.sh DEST [NAME PACKAGES]: a small Debian 12 root filesystem
# with the comma-separated Debian PACKAGES: `mmdebstrap --variant=essential
# --include=PACKAGES` from the host's Debian apt sources, without docs, man
# pages, locales or device nodes, as the tarball DEST/debian-NAME-<key>.tar,
# linked from DEST/debian-NAME.tar. Without NAME and PACKAGES it is the root
# with sudo for the exec-user tests (an image whose /etc/passwd is a real
# distribution's and that really has sudo): NAME sudo, PACKAGES sudo,passwd;
# the benchmark's network figures use NAME iperf3, PACKAGES iperf3. The
# harness and the bench wrap it into an OCI image and import it. key =
# sha256 of the mmdebstrap command line, the sources and mmdebstrap's
# version: made once per key (~30 s, ~100 MB), and only the current one of
# each NAME is kept.
set -euo pipefail
dest="$1" name="${2:-sudo}" packages="${3:-sudo,passwd}" suite=bookworm
case "$name" in
'' | *[!a-z0-9]*) echo "debian-image.sh: NAME $name: want lower-case letters and digits" >&2; exit 2 ;;
esac
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$dest"
src="$(mktemp)" log="$(mktemp)"
out=""
trap 'rm -f "$src" "$log" ${out:+"$out.tmp"}' EXIT
bash "$repo/.ci/debian-sources.sh" "$suite" > "$src"
# What the host's apt needs to reach its mirror (a proxy, a snapshot's
# expired Release files); nothing that changes which packages get installed.
aptopts=()
while IFS= read -r line; do
	aptopts+=(--aptopt="${line%;}")
done < <(apt-config dump | grep -E '^Acquire::(Check-Valid-Until|Check-Date|https?::Proxy|ftp::Proxy)( |::)' || true)
cmd=(mmdebstrap --variant=essential --include="$packages" --mode=root --format=tar --skip=output/dev
	"${aptopts[@]}" --dpkgopt=force-unsafe-io
	--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
	--dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*'
	--customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*'
	"$suite")
if ! command -v mmdebstrap >/dev/null; then
	echo "debian-image.sh: installing mmdebstrap"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >"$log" 2>&1 || {
		apt-get update -qq >>"$log" 2>&1 &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >>"$log" 2>&1
	} || { tail -20 "$log" >&2; exit 1; }
fi
key="$( { printf '%s\n' "${cmd[@]}"; echo "--- sources"; cat "$src"; mmdebstrap --version; } | sha256sum | cut -c1-16)"
out="$dest/debian-$name-$key.tar"
if [ ! -s "$out" ]; then
	echo "debian-image.sh: mmdebstrap --variant=essential --include=$packages $suite -> $out"
	if ! "${cmd[@]}" "$out.tmp" "$src" >"$log" 2>&1; then
		tail -20 "$log" >&2
		echo "debian-image.sh: mmdebstrap failed" >&2
		exit 1
	fi
	mv -f "$out.tmp" "$out"
	find "$dest" -maxdepth 1 -name "debian-$name-*.tar" ! -path "$out" -delete
fi
ln -sfn "$(basename "$out")" "$dest/debian-$name.tar"
