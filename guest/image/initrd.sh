#!/bin/bash
# initrd.sh: build Cocoon's guest initramfs, reproducibly.
#
# Usage: guest/image/initrd.sh --agent FILE --crun FILE --gen-init-cpio FILE
#                              --out FILE [--compression none|lz4] [--info FILE]
#
# Contents (newc cpio, entries sorted, uid/gid 0, every mtime =
# SOURCE_DATE_EPOCH (default 0)):
#   /init                      the agent (cocoon-agent is PID 1)
#   /usr/bin/crun              the OCI runtime: a static crun (crun.sh)
#   /usr/bin/busybox + applet links (sh, ls, mount, ...)  Debian's busybox-static
#   /etc/passwd /etc/group     root and nobody only
#   /dev/console               so the kernel can give PID 1 its console
#   /proc /sys /dev /run /tmp /var /mnt /root ...   the directory skeleton
#   /bin /sbin /lib /lib64     merged-/usr symlinks, as on Debian
# Every binary is static: the image has no shared libraries and no loader.
# --info writes shell assignments (OCI_RUNTIME_SHA256=...) for the manifest.
#
# crun, not runc: under emulation (TCG) a container's create + start +
# delete takes about 0.5 s with Debian's crun and 1.3 s with runc, whose Go
# runtime starts twice per container (runc, then runc init); built static,
# crun saves another 60-100 ms a call. See README.md.
set -euo pipefail

AGENT="" CRUN="" GEN="" OUTF="" COMP=none INFO=""
while [ $# -gt 0 ]; do
	case "$1" in
	--agent) AGENT="$2"; shift 2 ;;
	--crun) CRUN="$2"; shift 2 ;;
	--gen-init-cpio) GEN="$2"; shift 2 ;;
	--out) OUTF="$2"; shift 2 ;;
	--compression) COMP="$2"; shift 2 ;;
	--info) INFO="$2"; shift 2 ;;
	*) echo "initrd.sh: unknown argument: $1" >&2; exit 2 ;;
	esac
done
log() { echo "initrd.sh: $*" >&2; }
die() { echo "initrd.sh: error: $*" >&2; exit 1; }
[ -n "$AGENT" ] && [ -n "$CRUN" ] && [ -n "$GEN" ] && [ -n "$OUTF" ] ||
	die "usage: initrd.sh --agent FILE --crun FILE --gen-init-cpio FILE --out FILE [--compression none|lz4]"
[ -f "$AGENT" ] || die "agent binary not found: $AGENT"
[ -x "$CRUN" ] || die "crun binary not found: $CRUN"
[ -x "$GEN" ] || die "gen_init_cpio not executable: $GEN"
case "$COMP" in none|lz4) ;; *) die "compression must be none or lz4, not '$COMP'" ;; esac

SDE="${SOURCE_DATE_EPOCH:-0}"
export LC_ALL=C
static() { ! readelf -l "$1" 2>/dev/null | grep -q 'program interpreter'; }
static "$CRUN" || die "$CRUN is dynamically linked; the guest has no shared libraries (build it with crun.sh)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/cocoon-initrd.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# --- busybox, from Debian's busybox-static ----------------------------------------
BUSYBOX="${COCOON_BUSYBOX:-/bin/busybox}"
[ -x "$BUSYBOX" ] || die "no static busybox at $BUSYBOX (apt-get install busybox-static)"
static "$BUSYBOX" || die "$BUSYBOX is dynamically linked; the guest needs Debian's busybox-static"
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
	for d in /dev /etc /mnt /proc /root /run /sys /usr /usr/bin /usr/lib \
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
	echo "file /usr/bin/crun $(stage "$CRUN" crun) 0755 0 0"
	# A shell and the basic tools for the guest itself: `cocoon run`, and
	# anyone debugging a sandbox. Containers bring their own userland.
	echo "file /usr/bin/busybox $(stage "$BUSYBOX" busybox) 0755 0 0"
	for applet in $BUSYBOX_APPLETS; do
		echo "slink /usr/bin/$applet busybox 0777 0 0"
	done
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
	echo "OCI_RUNTIME_SHA256='$(sha256sum "$CRUN" | cut -c1-64)'" > "$INFO"
fi
log "initrd: $OUTF ($(stat -c %s "$OUTF") bytes, compression $COMP)"
