#!/bin/bash
# kernel.sh: build (or fetch from the cache) Cocoon's guest kernel.
#
# Usage: guest/image/kernel.sh [--fragment FILE] [--print-key]
#
# Builds an uncompressed, PVH-bootable vmlinux from Debian's linux-source-6.1
# with allnoconfig + kernel-fragment.config, everything built in. The result
# is cached under ${COCOON_CACHE:-/var/cache/cocoon}/kernel/<key>/ where key is
# the sha256 of: the linux-source package version, the fragment, this script
# and the compiler version. On a hit nothing is built.
#
# On success prints the cache directory (the last line of stdout); it holds:
#   vmlinux  config  kernel.release  source-version  gen_init_cpio  build.log
#
# Environment:
#   COCOON_CACHE          cache root (default /var/cache/cocoon)
#   COCOON_KERNEL_JOBS    make -j (default: nproc)
#
# It installs nothing: a missing build dependency fails with the package's
# name (`make deps` installs them all).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FRAGMENT="$HERE/kernel-fragment.config"
PRINT_KEY=0
while [ $# -gt 0 ]; do
	case "$1" in
	--fragment) FRAGMENT="$(realpath "$2")"; shift 2 ;;
	--print-key) PRINT_KEY=1; shift ;;
	-h|--help) sed -n '2,20p' "$0"; exit 0 ;;
	*) echo "kernel.sh: unknown argument: $1" >&2; exit 2 ;;
	esac
done

CACHE="${COCOON_CACHE:-/var/cache/cocoon}"
SRCPKG=linux-source-6.1
log() { echo "kernel.sh: $*" >&2; }
die() { echo "kernel.sh: error: $*" >&2; exit 1; }

[ -r "$FRAGMENT" ] || die "fragment not found: $FRAGMENT"

# --- build dependencies: `make deps` installs them; none is installed here ------
need_pkgs=()
for spec in gcc:gcc make:make bc:bc flex:flex bison:bison xz:xz-utils \
            perl:perl cpio:cpio; do
	command -v "${spec%%:*}" >/dev/null 2>&1 || need_pkgs+=("${spec#*:}")
done
# libelf headers (objtool), libc headers.
[ -e /usr/include/gelf.h ] || need_pkgs+=(libelf-dev)
[ -e /usr/include/stdio.h ] || need_pkgs+=(libc6-dev)
dpkg-query -W -f='${Status}' "$SRCPKG" 2>/dev/null | grep -q 'ok installed' ||
	need_pkgs+=("$SRCPKG")
[ ${#need_pkgs[@]} -eq 0 ] ||
	die "missing Debian packages: ${need_pkgs[*]} (make deps installs them: apt-get install ${need_pkgs[*]})"

SRCVER="$(dpkg-query -W -f='${Version}' "$SRCPKG")"
TARBALL=/usr/src/linux-source-6.1.tar.xz
[ -r "$TARBALL" ] || die "$TARBALL missing (package $SRCPKG $SRCVER looks broken)"
CCVER="$(gcc --version | sed -n 1p)"

# The fragment's option lines only ("# CONFIG_X is not set" included), so a
# comment edit does not invalidate the cache.
frag_options() { sed -E '/^# CONFIG_[A-Za-z0-9_]+ is not set$/b; /^[[:space:]]*(#|$)/d' "$FRAGMENT"; }
KEY="$( { echo "src=$SRCPKG $SRCVER"; echo "cc=$CCVER"; echo "--- fragment"; frag_options;
          echo "--- kernel.sh"; cat "$HERE/kernel.sh"; } | sha256sum | cut -c1-64)"
OUT="$CACHE/kernel/$KEY"
if [ "$PRINT_KEY" = 1 ]; then echo "$KEY"; exit 0; fi

if [ -s "$OUT/vmlinux" ] && [ -s "$OUT/kernel.release" ] && [ -x "$OUT/gen_init_cpio" ]; then
	log "cache hit: $OUT"
	echo "$OUT"
	exit 0
fi

# --- reproducible build environment ----------------------------------------------
# All timestamps come from the Debian changelog of the source package, so
# they change only with the source.
SDE="$( (zcat "/usr/share/doc/$SRCPKG/changelog.Debian.gz" 2>/dev/null || true) |
	sed -n 's/^ -- .*>  \(.*\)$/\1/p' | sed -n 1p)"
SDE_EPOCH="$(date -d "${SDE:-1970-01-01 00:00:00 UTC}" +%s)"
export SOURCE_DATE_EPOCH="$SDE_EPOCH"
export KBUILD_BUILD_TIMESTAMP="$(LC_ALL=C date -u -d "@$SDE_EPOCH" '+%a %b %e %H:%M:%S UTC %Y')"
export KBUILD_BUILD_USER=cocoon
export KBUILD_BUILD_HOST=cocoon
export KBUILD_BUILD_VERSION=1
export LC_ALL=C TZ=UTC
unset KCONFIG_CONFIG ARCH CROSS_COMPILE KBUILD_OUTPUT
# An outer make (`make guest VERSION=...`) hands its command-line variables
# down in MAKEFLAGS, and the kernel's Makefile has a VERSION of its own: the
# kernel came out as release "<VERSION>.1.192-cocoon".
unset MAKEFLAGS MFLAGS MAKEOVERRIDES MAKELEVEL

mkdir -p "$CACHE/kernel"
exec 9>"$CACHE/kernel/.lock"
flock 9
# Another build may have finished while we waited for the lock.
if [ -s "$OUT/vmlinux" ] && [ -x "$OUT/gen_init_cpio" ]; then
	log "cache hit: $OUT"; echo "$OUT"; exit 0
fi

# The work tree path is fixed per key: the same key always builds in the same
# directory, which keeps any path that leaks into the image identical.
WORK="$CACHE/kernel/work-$KEY"
rm -rf "$WORK"
mkdir -p "$WORK"
BLOG="$WORK/build.log"
T0=$(date +%s)
log "cache miss: building $SRCPKG $SRCVER (key ${KEY:0:12}); log: $BLOG"
tar -xf "$TARBALL" -C "$WORK" || die "cannot extract $TARBALL"
KSRC="$WORK/linux-source-6.1"
[ -f "$KSRC/Makefile" ] || die "unexpected layout of $TARBALL"

JOBS="${COCOON_KERNEL_JOBS:-$(nproc)}"
cd "$KSRC"
{
	frag_options > "$WORK/fragment.config"
	# -n: allnoconfig as the base; everything not in the fragment is off.
	scripts/kconfig/merge_config.sh -n "$WORK/fragment.config"
	make -s olddefconfig
} >>"$BLOG" 2>&1 || die "configuration failed, see $BLOG"

# --- every requested option must be in the final .config, with its value ----------
missing=0
while IFS= read -r line; do
	case "$line" in
	CONFIG_*=*) sym="${line%%=*}"; want="$line" ;;
	"# CONFIG_"*" is not set") sym="${line#\# }"; sym="${sym%% *}"; want="" ;;
	*) continue ;;
	esac
	got="$(grep -E "^(# )?$sym[= ]" .config || true)"
	if [ -z "$want" ]; then
		# "not set": absent, or explicitly not set, is fine.
		case "$got" in "$sym="*) [ "$got" != "$sym=n" ] && { echo "  $sym: requested off, got '$got'" >&2; missing=1; } ;; esac
	elif [ "$got" != "$want" ]; then
		echo "  $sym: requested '${want#*=}', got '${got:-absent}'" >&2
		missing=1
	fi
done < "$WORK/fragment.config"
[ "$missing" = 0 ] || die "requested kernel options were dropped by Kconfig (fix dependencies in $FRAGMENT)"
grep -q '=m$' .config && { grep '=m$' .config >&2; die "config has modules (=m); everything must be built in"; }

log "configured; compiling with -j$JOBS (cold build: ~5 min on 2 cores)"
make -j"$JOBS" vmlinux >>"$BLOG" 2>&1 || { tail -40 "$BLOG" >&2; die "kernel build failed, see $BLOG"; }
[ -x usr/gen_init_cpio ] || make usr/gen_init_cpio >>"$BLOG" 2>&1 || die "cannot build usr/gen_init_cpio"
# The PVH ELF note (XEN_ELFNOTE_PHYS32_ENTRY = 18) must be there for QEMU.
readelf -n vmlinux 2>/dev/null | grep -q 'Xen' || die "vmlinux has no PVH entry note"

TMP="$CACHE/kernel/.tmp-$KEY"
rm -rf "$TMP"; mkdir -p "$TMP"
cp vmlinux "$TMP/vmlinux"
cp .config "$TMP/config"
make -s kernelrelease > "$TMP/kernel.release"
echo "$SRCPKG $SRCVER" > "$TMP/source-version"
cp usr/gen_init_cpio "$TMP/gen_init_cpio"
cp "$BLOG" "$TMP/build.log"
echo "$(( $(date +%s) - T0 ))" > "$TMP/build-seconds"
cd /
rm -rf "$OUT"
mv "$TMP" "$OUT"
rm -rf "$WORK"
log "built in $(cat "$OUT/build-seconds")s: $OUT ($(cat "$OUT/kernel.release"))"
echo "$OUT"
