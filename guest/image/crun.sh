#!/bin/bash
# crun.sh: build (or fetch from the cache) the guest's OCI runtime, a static
# crun from Debian's source package.
#
# Usage: guest/image/crun.sh [--print-key]
#
# Debian's binary crun is linked against eleven shared libraries (libsystemd
# and what it pulls in); under TCG the dynamic loader alone costs each crun
# call about 100 ms, and a container's create, start and exec are crun calls.
# This builds Debian's crun source (its patches applied) without systemd,
# CRIU and dlopen, with yajl embedded, as one static binary: `crun --version`
# takes 20-30 ms in the guest instead of 120-140 ms. seccomp, capabilities,
# eBPF device control, AppArmor and SELinux labels stay in.
#
# The source comes through apt (`apt-get source`, with a private deb-src list
# made from the host's apt sources; nothing of the host's apt state changes).
# The result is cached under ${COCOON_CACHE:-/var/cache/cocoon}/crun/<key>/
# where key is the sha256 of: the source version, this script, the compiler
# and binutils, the static libraries linked in, the kernel headers and the
# Python that generates libocispec's sources. On a hit nothing is fetched or
# built. It installs nothing: a missing build dependency fails with the
# package's name (`make deps` installs them all).
#
# On success prints the cache directory (the last line of stdout); it holds:
#   crun  source-version  build.log
#
# Environment:
#   COCOON_CACHE          cache root (default /var/cache/cocoon)
#   COCOON_CRUN_VERSION   Debian source version to build (default: the
#                         version of the crun package apt would install)
#   COCOON_NO_APT=1       never call apt-get; use cached sources only
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PRINT_KEY=0
while [ $# -gt 0 ]; do
	case "$1" in
	--print-key) PRINT_KEY=1; shift ;;
	-h|--help) sed -n '2,31p' "$0"; exit 0 ;;
	*) echo "crun.sh: unknown argument: $1" >&2; exit 2 ;;
	esac
done

CACHE="${COCOON_CACHE:-/var/cache/cocoon}"
log() { echo "crun.sh: $*" >&2; }
die() { echo "crun.sh: error: $*" >&2; exit 1; }
export LC_ALL=C TZ=UTC
# Nothing of an outer make (`make guest VERSION=...`: its command-line
# variables come down in MAKEFLAGS) reaches crun's own Makefile.
unset MAKEFLAGS MFLAGS MAKEOVERRIDES MAKELEVEL

# --- build dependencies: `make deps` installs them; none is installed here ------
need_pkgs=()
for spec in gcc:gcc make:make pkg-config:pkg-config dpkg-source:dpkg-dev xz:xz-utils \
            readelf:binutils strip:binutils apt-get:apt; do
	command -v "${spec%%:*}" >/dev/null 2>&1 || need_pkgs+=("${spec#*:}")
done
# Debian's python3, whatever else is first on PATH: libocispec generates its
# C sources with it at build time.
[ -x /usr/bin/python3 ] || need_pkgs+=(python3)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need_pkgs+=(libc6-dev)
[ -e /usr/lib/x86_64-linux-gnu/libseccomp.a ] || need_pkgs+=(libseccomp-dev)
[ -e /usr/lib/x86_64-linux-gnu/libcap.a ] || need_pkgs+=(libcap-dev)
if [ ${#need_pkgs[@]} -gt 0 ]; then
	mapfile -t need_pkgs < <(printf '%s\n' "${need_pkgs[@]}" | sort -u)
	die "missing Debian packages: ${need_pkgs[*]} (make deps installs them: apt-get install ${need_pkgs[*]})"
fi

# --- which source ----------------------------------------------------------------
VERSION="${COCOON_CRUN_VERSION:-$(apt-cache show --no-all-versions crun 2>/dev/null | sed -n 's/^Version: //p' | sed -n 1p)}"
SRCDIR="$CACHE/src/crun"
if [ -z "$VERSION" ]; then
	# No apt lists: the newest cached source, if any.
	VERSION="$(ls -1 "$SRCDIR" 2>/dev/null | sed -n 's/^crun_\(.*\)\.dsc$/\1/p' | sort -V | tail -1 || true)"
	[ -n "$VERSION" ] || die "no crun version known (run apt-get update) and no cached source in $SRCDIR"
	log "warning: apt knows no crun; using the cached source $VERSION"
fi
UPVER="${VERSION#*:}"
DSC="$SRCDIR/crun_${UPVER}.dsc"

pkgver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo none; }
KEY="$( { echo "crun=$VERSION"; echo "cc=$(gcc --version | sed -n 1p) binutils=$(pkgver binutils)"
          echo "libc=$(pkgver libc6-dev) linux-libc-dev=$(pkgver linux-libc-dev)"
          echo "seccomp=$(pkgver libseccomp-dev) cap=$(pkgver libcap-dev)"
          echo "python=$(/usr/bin/python3 --version 2>&1)"
          echo "--- crun.sh"; cat "$HERE/crun.sh"; } | sha256sum | cut -c1-64)"
OUT="$CACHE/crun/$KEY"
if [ "$PRINT_KEY" = 1 ]; then echo "$KEY"; exit 0; fi
if [ -x "$OUT/crun" ]; then
	log "cache hit: $OUT"
	echo "$OUT"
	exit 0
fi

mkdir -p "$CACHE/crun" "$SRCDIR"
exec 9>"$CACHE/crun/.lock"
flock 9
if [ -x "$OUT/crun" ]; then log "cache hit: $OUT"; echo "$OUT"; exit 0; fi

# --- the source package, through a private deb-src list -------------------------
if [ ! -s "$DSC" ]; then
	[ "${COCOON_NO_APT:-0}" = 1 ] && die "crun source $VERSION not in $SRCDIR (COCOON_NO_APT=1)"
	APTDIR="$CACHE/apt-src"
	rm -rf "$APTDIR"
	mkdir -p "$APTDIR/lists/partial" "$APTDIR/parts" "$APTDIR/archives/partial"
	# The host's sources, as deb-src: one-line and deb822 files alike.
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -r "$f" ] && sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$f" >> "$APTDIR/parts/host.list"
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] && sed 's/^Types:.*/Types: deb-src/' "$f" > "$APTDIR/parts/$(basename "$f")"
	done
	touch "$APTDIR/parts/host.list"
	APT=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$APTDIR/parts"
	     -o "Dir::State::Lists=$APTDIR/lists" -o "Dir::Cache=$APTDIR" -o APT::Sandbox::User=root)
	log "fetching the source of crun $VERSION (apt-get source)"
	apt-get "${APT[@]}" -q update >&2 || die "apt-get update of the deb-src lists failed"
	( cd "$SRCDIR" && apt-get "${APT[@]}" -q source --download-only "crun=$VERSION" >&2 ) ||
		die "apt-get source crun=$VERSION failed"
	rm -rf "$APTDIR"
	[ -s "$DSC" ] || die "apt-get source left no $DSC"
fi

# --- build -------------------------------------------------------------------------
# A fixed work path per key, mapped away in debug info and __FILE__, keeps
# the binary identical from build to build.
WORK="$CACHE/crun/work-$KEY"
rm -rf "$WORK"
mkdir -p "$WORK"
BLOG="$WORK/build.log"
T0=$(date +%s)
log "cache miss: building crun $VERSION (key ${KEY:0:12}); log: $BLOG"
dpkg-source --no-check -x "$DSC" "$WORK/src" >>"$BLOG" 2>&1 || die "dpkg-source -x failed, see $BLOG"
cd "$WORK/src"
SDE="$(dpkg-parsechangelog -S Timestamp 2>/dev/null || echo 0)"
export SOURCE_DATE_EPOCH="$SDE"
CFLAGS="-O2 -g0 -ffile-prefix-map=$WORK/src=. -fdebug-prefix-map=$WORK/src=."
# crun 1.8.1 builds the embedded yajl but gives only libocispec the path of
# its headers; crun's own sources include <yajl/yajl_tree.h> too, and found
# it only where libyajl-dev was installed. With the path given here they
# always get the embedded headers, which also come before any system ones.
CPPFLAGS="-I$WORK/src/libocispec/yajl/src/headers"
{
	# gcrypt is optional (only for a seccomp cache); without it nothing
	# else is linked in.
	ac_cv_search_gcry_check_version=no ./configure CFLAGS="$CFLAGS" CPPFLAGS="$CPPFLAGS" \
		PYTHON=/usr/bin/python3 \
		--disable-systemd --disable-criu --disable-dl --enable-embedded-yajl --disable-shared &&
	make -j"$(nproc)" git-version.h .version &&
	make -C libocispec/yajl -j"$(nproc)" &&
	# libocispec generates its headers (with python3) as it builds, and crun's
	# objects include them without depending on them: under -j, crun.c could
	# be compiled before runtime_spec_schema_config_schema.h was written.
	make -C libocispec -j"$(nproc)" libocispec.la &&
	make -j"$(nproc)" crun LDFLAGS=-all-static
} >>"$BLOG" 2>&1 || {
	# With -j the first error is seldom on the last lines.
	grep -E -m 10 '(^|[^a-z])(fatal )?error: |\*\*\* ' "$BLOG" >&2 || true
	tail -20 "$BLOG" >&2
	die "crun build failed, see $BLOG"
}
readelf -l crun 2>/dev/null | grep -q 'program interpreter' && die "crun came out dynamically linked"
./crun --version >>"$BLOG" 2>&1 || die "the built crun does not run, see $BLOG"

TMP="$CACHE/crun/.tmp-$KEY"
rm -rf "$TMP"; mkdir -p "$TMP"
strip -o "$TMP/crun" crun
echo "crun $VERSION (Debian source, static)" > "$TMP/source-version"
cp "$BLOG" "$TMP/build.log"
cd /
rm -rf "$OUT"
mv "$TMP" "$OUT"
rm -rf "$WORK"
log "built in $(( $(date +%s) - T0 ))s: $OUT"
echo "$OUT"
