#!/bin/bash
# initrd.sh: build Cocoon's guest initramfs, reproducibly.
#
# Usage: guest/image/initrd.sh --agent FILE --gen-init-cpio FILE --out FILE
#                              [--compression none|lz4] [--info FILE]
#
# Contents (newc cpio, entries sorted, uid/gid 0, every mtime =
# SOURCE_DATE_EPOCH (default 0)):
#   /init                      the agent (cocoon-agent is PID 1)
#   /usr/bin/crun              the OCI runtime: Debian's crun (apt-get download; not
#                              installed on the host by this script)
#   /usr/lib/x86_64-linux-gnu/<soname>, /usr/lib64/ld-linux-x86-64.so.2
#                              crun's shared libraries, from the host's Debian packages
#   /usr/bin/busybox + applet links (sh, ls, mount, ...)  Debian's busybox-static
#   /etc/passwd /etc/group     root and nobody only
#   /dev/console               so the kernel can give PID 1 its console
#   /proc /sys /dev /run /tmp /var /mnt /root ...   the directory skeleton
#   /bin /sbin /lib /lib64     merged-/usr symlinks, as on Debian
# --info writes shell assignments (OCI_RUNTIME_VERSION=..., ...) for the manifest.
#
# crun, not runc: under emulation (TCG) a container's create + start +
# delete takes about 0.5 s with crun and 1.3 s with runc, whose Go runtime
# starts twice per container (runc, then runc init); see README.md.
set -euo pipefail

AGENT="" GEN="" OUTF="" COMP=none INFO=""
while [ $# -gt 0 ]; do
	case "$1" in
	--agent) AGENT="$2"; shift 2 ;;
	--gen-init-cpio) GEN="$2"; shift 2 ;;
	--out) OUTF="$2"; shift 2 ;;
	--compression) COMP="$2"; shift 2 ;;
	--info) INFO="$2"; shift 2 ;;
	*) echo "initrd.sh: unknown argument: $1" >&2; exit 2 ;;
	esac
done
log() { echo "initrd.sh: $*" >&2; }
die() { echo "initrd.sh: error: $*" >&2; exit 1; }
[ -n "$AGENT" ] && [ -n "$GEN" ] && [ -n "$OUTF" ] || die "usage: initrd.sh --agent FILE --gen-init-cpio FILE --out FILE [--compression none|lz4]"
[ -f "$AGENT" ] || die "agent binary not found: $AGENT"
[ -x "$GEN" ] || die "gen_init_cpio not executable: $GEN"
case "$COMP" in none|lz4) ;; *) die "compression must be none or lz4, not '$COMP'" ;; esac

CACHE="${COCOON_CACHE:-/var/cache/cocoon}"
SDE="${SOURCE_DATE_EPOCH:-0}"
export LC_ALL=C

# --- the OCI runtime from Debian, as a .deb (cached) -----------------------------
DEBS="$CACHE/debs"
mkdir -p "$DEBS"
OCI_RUNTIME=crun
OCI_RUNTIME_VERSION="${COCOON_CRUN_VERSION:-$(apt-cache show --no-all-versions "$OCI_RUNTIME" 2>/dev/null | sed -n 's/^Version: //p' | sed -n 1p)}"
OCI_DEB=""
if [ -n "$OCI_RUNTIME_VERSION" ]; then
	OCI_DEB="$DEBS/${OCI_RUNTIME}_$(echo "$OCI_RUNTIME_VERSION" | sed 's/:/%3a/')_amd64.deb"
	if [ ! -s "$OCI_DEB" ]; then
		log "downloading $OCI_RUNTIME $OCI_RUNTIME_VERSION (apt-get download)"
		( cd "$DEBS" && apt-get download -q -o APT::Sandbox::User=root "$OCI_RUNTIME=$OCI_RUNTIME_VERSION" >&2 ) || OCI_DEB=""
	fi
fi
if [ -z "$OCI_DEB" ] || [ ! -s "$OCI_DEB" ]; then
	# Offline, or apt lists missing: use the newest cached .deb if any.
	OCI_DEB="$(ls -1 "$DEBS/${OCI_RUNTIME}"_*_amd64.deb 2>/dev/null | sort -V | tail -1 || true)"
	[ -n "$OCI_DEB" ] || die "cannot get Debian's $OCI_RUNTIME package (apt-get download $OCI_RUNTIME failed; run apt-get update?)"
	log "warning: using cached $OCI_DEB"
fi
OCI_RUNTIME_VERSION="$(dpkg-deb -f "$OCI_DEB" Version)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/cocoon-initrd.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
dpkg-deb -x "$OCI_DEB" "$WORK/oci-deb"
OCI_BIN="$WORK/oci-deb/usr/bin/$OCI_RUNTIME"
[ -x "$OCI_BIN" ] || OCI_BIN="$WORK/oci-deb/usr/sbin/$OCI_RUNTIME"
[ -x "$OCI_BIN" ] || die "no $OCI_RUNTIME binary in $OCI_DEB"

# --- shared libraries: NEEDED entries, resolved on the host, recursively -----------
LIBDIRS="/usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /lib64"
find_lib() {
	local d
	for d in $LIBDIRS; do [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }; done
	return 1
}
declare -A LIBS=()
resolve() {
	local so path
	for so in $(readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
		[ -n "${LIBS[$so]:-}" ] && continue
		path="$(find_lib "$so")" || {
			# The library is not on the host: install the Debian package that has it.
			case "$so" in
			libseccomp.so.*) pkg=libseccomp2 ;;
			libyajl.so.*) pkg=libyajl2 ;;
			libcap.so.*) pkg=libcap2 ;;
			*) die "$1 needs $so, which is not on this host" ;;
			esac
			[ "$(id -u)" = 0 ] || die "$so missing on the host: apt-get install $pkg"
			log "installing $pkg (a library of $OCI_RUNTIME)"
			DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$pkg" >&2
			path="$(find_lib "$so")" || die "$so still missing after installing $pkg"
		}
		LIBS[$so]="$(readlink -f "$path")"
		resolve "${LIBS[$so]}"
	done
}
resolve "$OCI_BIN"
INTERP="$(readelf -l "$OCI_BIN" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')"
[ -n "$INTERP" ] || INTERP=/lib64/ld-linux-x86-64.so.2

# --- busybox, from Debian's busybox-static ----------------------------------------
BUSYBOX="${COCOON_BUSYBOX:-/bin/busybox}"
[ -x "$BUSYBOX" ] || die "no static busybox at $BUSYBOX (apt-get install busybox-static)"
if readelf -l "$BUSYBOX" 2>/dev/null | grep -q 'program interpreter'; then
	die "$BUSYBOX is dynamically linked; the guest needs Debian's busybox-static"
fi
BUSYBOX_APPLETS="sh cat cp cut date dd df dmesg echo env false free grep head hostname id kill \
	ln ls mkdir mount mv ps rm sed seq sleep sort stty sync tail tee tr true tty umount uname wc yes"

# --- staging: copies with fixed mtimes (gen_init_cpio takes a file's own mtime) ----
ST="$WORK/stage"
mkdir -p "$ST"
stage() { # stage <src> <name>  -> prints staged path
	install -m 0755 "$1" "$ST/$2"
	touch -h -d "@$SDE" "$ST/$2"
	echo "$ST/$2"
}
LIST="$WORK/list"
{
	for d in /dev /etc /mnt /proc /root /run /sys /usr /usr/bin /usr/lib /usr/lib/x86_64-linux-gnu \
	         /usr/lib64 /usr/sbin /var /var/lib /var/log /var/tmp; do
		case "$d" in
		/proc|/sys) echo "dir $d 0555 0 0" ;;
		/root) echo "dir $d 0700 0 0" ;;
		/var/tmp) echo "dir $d 1777 0 0" ;;
		*) echo "dir $d 0755 0 0" ;;
		esac
	done
	echo "dir /tmp 1777 0 0"
	echo "nod /dev/console 0600 0 0 c 5 1"
	echo "slink /bin usr/bin 0777 0 0"
	echo "slink /sbin usr/sbin 0777 0 0"
	echo "slink /lib usr/lib 0777 0 0"
	echo "slink /lib64 usr/lib64 0777 0 0"
	echo "slink /var/run ../run 0777 0 0"
	echo "file /init $(stage "$AGENT" init) 0755 0 0"
	echo "file /usr/bin/$OCI_RUNTIME $(stage "$OCI_BIN" "$OCI_RUNTIME") 0755 0 0"
	# A shell and the basic tools for the guest itself: `cocoon run`, and
	# anyone debugging a sandbox. Containers bring their own userland.
	echo "file /usr/bin/busybox $(stage "$BUSYBOX" busybox) 0755 0 0"
	for applet in $BUSYBOX_APPLETS; do
		echo "slink /usr/bin/$applet busybox 0777 0 0"
	done
	for so in "${!LIBS[@]}"; do
		echo "file /usr/lib/x86_64-linux-gnu/$so $(stage "${LIBS[$so]}" "$so") 0755 0 0"
	done
	# The dynamic loader at the path the runtime asks for (/lib64 -> usr/lib64).
	ldso="$(readlink -f "$INTERP")"
	[ -f "$ldso" ] || die "dynamic loader $INTERP not found on the host"
	ldbase="$(basename "$INTERP")"
	if [ -z "${LIBS[$ldbase]:-}" ]; then
		echo "file /usr/lib/x86_64-linux-gnu/$ldbase $(stage "$ldso" "$ldbase") 0755 0 0"
	fi
	echo "slink /usr/lib64/$ldbase ../lib/x86_64-linux-gnu/$ldbase 0777 0 0"
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' > "$ST/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' > "$ST/group"
	printf 'cocoon\n' > "$ST/hostname"
	chmod 0644 "$ST/passwd" "$ST/group" "$ST/hostname"
	touch -d "@$SDE" "$ST/passwd" "$ST/group" "$ST/hostname"
	echo "file /etc/passwd $ST/passwd 0644 0 0"
	echo "file /etc/group $ST/group 0644 0 0"
	echo "file /etc/hostname $ST/hostname 0644 0 0"
} > "$LIST.unsorted"
# Sort by path (field 2) so the archive order never depends on hash order;
# parents sort before children.
sort -k2,2 -s "$LIST.unsorted" > "$LIST"

"$GEN" -t "$SDE" "$LIST" > "$WORK/initrd.cpio" || die "gen_init_cpio failed"
case "$COMP" in
none) mv "$WORK/initrd.cpio" "$WORK/out" ;;
lz4)
	# Legacy lz4 frame format (-l): what the kernel's initramfs unpacker reads.
	lz4 -l -9 -q -c "$WORK/initrd.cpio" > "$WORK/out" || die "lz4 failed" ;;
esac
mkdir -p "$(dirname "$OUTF")"
mv "$WORK/out" "$OUTF.tmp.$$" && mv "$OUTF.tmp.$$" "$OUTF"

if [ -n "$INFO" ]; then
	{
		echo "OCI_RUNTIME='$OCI_RUNTIME'"
		echo "OCI_RUNTIME_VERSION='$OCI_RUNTIME_VERSION'"
		echo "OCI_RUNTIME_SHA256='$(sha256sum "$OCI_BIN" | cut -c1-64)'"
		libs=""
		for so in $(printf '%s\n' "${!LIBS[@]}" | sort); do
			pkg="$(dpkg -S "${LIBS[$so]}" 2>/dev/null | sed -n 1p | cut -d: -f1 || true)"
			[ -z "$pkg" ] && pkg="$(dpkg -S "$(echo "${LIBS[$so]}" | sed 's|^/usr||')" 2>/dev/null | sed -n 1p | cut -d: -f1 || true)"
			ver="$( [ -n "$pkg" ] && dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || echo unknown)"
			libs="$libs $so=${pkg:-unknown}:$ver"
		done
		echo "OCI_RUNTIME_LIBS='${libs# }'"
	} > "$INFO"
fi
log "initrd: $OUTF ($(stat -c %s "$OUTF") bytes, compression $COMP, $OCI_RUNTIME $OCI_RUNTIME_VERSION)"
