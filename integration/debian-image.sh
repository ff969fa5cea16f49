#!/bin/bash
# debian-image.sh DEST: a small Debian 12 root filesystem with sudo, for the
# exec-user tests (an image whose /etc/passwd is a real distribution's and
# that really has sudo): `mmdebstrap --variant=essential --include=sudo,passwd`
# from the host's Debian apt sources, without docs, man pages, locales or
# device nodes, as the tarball DEST/debian-sudo-<key>.tar, linked from
# DEST/debian-sudo.tar. The harness wraps it into an OCI image and imports
# it. key = sha256 of the mmdebstrap command line, the sources and
# mmdebstrap's version: made once per key (~30 s, ~100 MB), and only the
# current one is kept.
set -euo pipefail
dest="$1" suite=bookworm
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
cmd=(mmdebstrap --variant=essential --include=sudo,passwd --mode=root --format=tar --skip=output/dev
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
out="$dest/debian-sudo-$key.tar"
if [ ! -s "$out" ]; then
	echo "debian-image.sh: mmdebstrap --variant=essential --include=sudo,passwd $suite -> $out"
	if ! "${cmd[@]}" "$out.tmp" "$src" >"$log" 2>&1; then
		tail -20 "$log" >&2
		echo "debian-image.sh: mmdebstrap failed" >&2
		exit 1
	fi
	mv -f "$out.tmp" "$out"
	find "$dest" -maxdepth 1 -name 'debian-sudo-*.tar' ! -path "$out" -delete
fi
ln -sfn "$(basename "$out")" "$dest/debian-sudo.tar"
