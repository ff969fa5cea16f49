#!/bin/bash
# build.sh: build Cocoon's guest image: kernel and crun (cached) + initrd +
# manifest.
#
# Usage: guest/image/build.sh <agent-binary> <outdir>
#   e.g. guest/image/build.sh bin/cocoon-agent build/guest
#
# Writes <outdir>/vmlinux, <outdir>/initrd.img, <outdir>/manifest.json.
# Idempotent and reproducible: the same inputs give byte-identical outputs
# (the kernel and crun are cached under ${COCOON_CACHE:-/var/cache/cocoon}/).
#
# Environment:
#   COCOON_CACHE               cache root (default /var/cache/cocoon)
#   COCOON_INITRD_COMPRESSION  none (default, measured fastest) or lz4
#   COCOON_CRUN_VERSION        Debian crun source version to build (default: apt candidate)
#   SOURCE_DATE_EPOCH          mtime of every initrd entry (default 0)
#   COCOON_NO_APT=1            crun.sh fetches no source with apt-get
#
# Installs nothing: a missing build dependency fails with the package's name
# (`make deps` installs them all).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "build.sh: error: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

[ $# -eq 2 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
AGENT="$1" OUTDIR="$2"
[ -f "$AGENT" ] || die "agent binary not found: $AGENT (build it first: make build)"
[ -x "$AGENT" ] || die "agent binary is not executable: $AGENT"
COMP="${COCOON_INITRD_COMPRESSION:-none}"
case "$COMP" in none|lz4) ;; *) die "COCOON_INITRD_COMPRESSION must be none or lz4" ;; esac
need=()
command -v jq >/dev/null || need+=(jq)
command -v readelf >/dev/null || need+=(binutils)
[ "$COMP" = lz4 ] && ! command -v lz4 >/dev/null && need+=(lz4)
# The guest's own shell and tools (initrd.sh): a static busybox.
bb="${COCOON_BUSYBOX:-/bin/busybox}"
if [ ! -x "$bb" ] || readelf -l "$bb" 2>/dev/null | grep -q 'program interpreter'; then
	[ -z "${COCOON_BUSYBOX:-}" ] && need+=(busybox-static)
fi
# Nothing is installed here: a package missing from `make deps` shows.
[ ${#need[@]} -eq 0 ] ||
	die "missing Debian packages: ${need[*]} (make deps installs them: apt-get install ${need[*]})"
# PID 1 of the guest: must be an x86-64 ELF executable; a static one, since the
# image has no shared libraries.
hdr="$(readelf -h "$AGENT" 2>/dev/null)" || die "agent is not an ELF file: $AGENT"
grep -q 'X86-64' <<<"$hdr" || die "agent is not an x86-64 binary: $AGENT"
if readelf -l "$AGENT" 2>/dev/null | grep -q 'program interpreter'; then
	log "warning: $AGENT is dynamically linked; the guest has no shared libraries (build it with CGO_ENABLED=0)"
fi
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-0}"

T0=$(date +%s)
KOUT="$("$HERE/kernel.sh")" || die "kernel build failed (see messages above)"
KDIR="${KOUT##*$'\n'}"
[ -s "$KDIR/vmlinux" ] || die "kernel.sh did not produce a kernel"

mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
TMP="$(mktemp -d "$OUTDIR/.build.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

COUT="$("$HERE/crun.sh")" || die "crun build failed (see messages above)"
CDIR="${COUT##*$'\n'}"
[ -x "$CDIR/crun" ] || die "crun.sh did not produce crun"

"$HERE/initrd.sh" --agent "$AGENT" --crun "$CDIR/crun" --gen-init-cpio "$KDIR/gen_init_cpio" \
	--out "$TMP/initrd.img" --compression "$COMP" --info "$TMP/info"
# shellcheck disable=SC1091
. "$TMP/info"
cp "$KDIR/vmlinux" "$TMP/vmlinux"

sha() { sha256sum "$1" | cut -c1-64; }
KREL="$(cat "$KDIR/kernel.release")"
KVER="${KREL%%-*}"
# The recommended command line (measured, see README.md). The host appends,
# at run time, under TCG only:
#   noapictimer noreplace-smp tsc=reliable tsc_early_khz=<host TSC kHz> lpj=<tsc_khz*1000/HZ>
# (HZ=100, so lpj = tsc_khz * 10). Under KVM nothing is appended.
CMDLINE="console=ttyS0 reboot=t panic=-1 quiet no_timer_check"
TCG_APPEND="noapictimer noreplace-smp tsc=reliable tsc_early_khz={tsc_khz} lpj={lpj}"
HZ="$(sed -n 's/^CONFIG_HZ=//p' "$KDIR/config")"

jq -n --sort-keys \
	--arg ksha "$(sha "$TMP/vmlinux")" --arg kver "$KVER" --arg krel "$KREL" \
	--arg ksrc "$(cat "$KDIR/source-version")" --arg cmdline "$CMDLINE" \
	--arg kcfg "$(sha "$KDIR/config")" \
	--arg isha "$(sha "$TMP/initrd.img")" --arg comp "$COMP" \
	--argjson isize "$(stat -c %s "$TMP/initrd.img")" \
	--arg ocisrc "$(cat "$CDIR/source-version")" --arg ocisha "$OCI_RUNTIME_SHA256" \
	--arg asha "$(sha "$AGENT")" --arg tcgappend "$TCG_APPEND" --argjson hz "${HZ:-100}" \
	'{
	  schema: 1,
	  kernel: {
	    path: "vmlinux", sha256: $ksha, version: $kver, release: $krel,
	    source: $ksrc, config_sha256: $kcfg, format: "elf-pvh", hz: $hz,
	    cmdline: $cmdline,
	    modules: false
	  },
	  initrd: { path: "initrd.img", sha256: $isha, compression: $comp, size: $isize },
	  components: {
	    oci_runtime: $ocisrc, oci_runtime_sha256: $ocisha, agent_sha256: $asha
	  },
	  boot: {
	    machine: "microvm,acpi=off",
	    cpu_tcg: "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt,+rdrand",
	    cpu_kvm: "host",
	    cmdline_append_tcg: $tcgappend,
	    cmdline_append_kvm: "",
	    lpj: "tsc_khz * 1000 / hz",
	    shutdown: "guest reboot(2) with reboot=t; run qemu with -no-reboot",
	    agent_port_name: "io.cocoon.agent.0"
	  }
	}' > "$TMP/manifest.json"

# Publish: files first, the manifest last (a reader that sees a manifest sees
# the files it describes).
mv -f "$TMP/vmlinux" "$OUTDIR/vmlinux"
mv -f "$TMP/initrd.img" "$OUTDIR/initrd.img"
mv -f "$TMP/manifest.json" "$OUTDIR/manifest.json"
log "done in $(( $(date +%s) - T0 ))s: $OUTDIR/{vmlinux,initrd.img,manifest.json}"
log "kernel $KREL sha256 $(sha "$OUTDIR/vmlinux" | cut -c1-16)..., initrd ($COMP) sha256 $(sha "$OUTDIR/initrd.img" | cut -c1-16)..."
