#!/bin/bash
# bench-boot.sh: measure guest boot time, QEMU start -> PID 1 prints a marker.
#
# Usage: guest/image/bench-boot.sh [options] [-- extra qemu args]
#   -k FILE     kernel (default build/guest/vmlinux)
#   -i FILE     initrd (default build/guest/initrd.img)
#   -n N        runs (default 7)
#   -a STR      full kernel command line (default: from manifest.json next to
#               the kernel: kernel.cmdline + boot.cmdline_append_tcg under TCG,
#               with {tsc_khz} and {lpj} filled in as the host must do)
#   -A STR      append STR to the command line
#   -M STR      machine (default: manifest boot.machine, else microvm,acpi=off)
#   -c CPU      cpu model (default: manifest boot.cpu_tcg / cpu_kvm, else qemu64)
#   -m MEM      memory (default 256)
#   -s SMP      vcpus (default 1)
#   -x ACCEL    accelerator (default tcg)
#   -r MARKER   line that ends a run (default COCOON-TESTINIT-READY; for the
#               real agent use whatever it prints when ready)
#   -l LABEL    label for the summary line
#   -v          print the console of the first run
# Under TCG, tsc_early_khz=<host TSC kHz> is appended if the command line
# lacks it (see tsc_khz below: the host side must do the same at run time).
#
# Prints one line per run and a summary:
#   LABEL  median=<ms> min=<ms> max=<ms> guest_uptime_median=<s> n=<N>
# Wall time is taken on the host with $EPOCHREALTIME (no fork) just before
# QEMU is exec'd and when the marker line is read from the serial console.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
KERNEL="$ROOT/build/guest/vmlinux"
INITRD="$ROOT/build/guest/initrd.img"
N=7 APPEND="" EXTRA_APPEND="" MACHINE="" CPU="" MEM=256 SMP=1 ACCEL=tcg
MARKER=COCOON-TESTINIT-READY LABEL="" VERBOSE=0 TIMEOUT=60
while getopts "k:i:n:a:A:M:c:m:s:x:r:l:t:vh" o; do
	case "$o" in
	k) KERNEL="$OPTARG" ;; i) INITRD="$OPTARG" ;; n) N="$OPTARG" ;;
	a) APPEND="$OPTARG" ;; A) EXTRA_APPEND="$OPTARG" ;; M) MACHINE="$OPTARG" ;;
	c) CPU="$OPTARG" ;; m) MEM="$OPTARG" ;; s) SMP="$OPTARG" ;; x) ACCEL="$OPTARG" ;;
	r) MARKER="$OPTARG" ;; l) LABEL="$OPTARG" ;; t) TIMEOUT="$OPTARG" ;; v) VERBOSE=1 ;;
	h) sed -n '2,26p' "$0"; exit 0 ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
EXTRA_QEMU=("$@")

# Host TSC frequency in kHz. Under TCG the guest's TSC runs at the host's TSC
# rate (QEMU reads the host TSC), but the guest cannot calibrate it (no PIT/HPET
# reference on microvm) and hangs or guesses; so the host tells it.
# Sources, best first: sysfs (some kernels), the kernel's own TSC-derived
# bogomips (= tsc_khz/500 on x86 since the delay loop is TSC based), cpu MHz.
tsc_khz() {
	local f=/sys/devices/system/cpu/cpu0/tsc_freq_khz v
	if [ -r "$f" ]; then cat "$f"; return; fi
	v="$(awk -F: '/^bogomips/ {gsub(/ /,"",$2); printf "%d\n", $2*500 + 0.5; exit}' /proc/cpuinfo)"
	if [ -n "$v" ] && [ "$v" -gt 0 ]; then echo "$v"; return; fi
	awk -F: '/^cpu MHz/ {gsub(/ /,"",$2); printf "%d\n", $2*1000 + 0.5; exit}' /proc/cpuinfo
}

MAN="$(dirname "$KERNEL")/manifest.json"
man() { if [ -r "$MAN" ] && command -v jq >/dev/null; then jq -r "$1 // empty" "$MAN"; fi; }
TSC_KHZ="$(tsc_khz)"
HZ="$(man .kernel.hz)"; HZ="${HZ:-100}"
LPJ=$(( TSC_KHZ * 1000 / HZ ))
if [ -z "$APPEND" ]; then
	APPEND="$(man .kernel.cmdline)"
	APPEND="${APPEND:-console=ttyS0 reboot=t panic=-1 quiet}"
	if [ "$ACCEL" = tcg ]; then
		add="$(man .boot.cmdline_append_tcg)"
		add="${add//\{tsc_khz\}/$TSC_KHZ}"; add="${add//\{lpj\}/$LPJ}"
		APPEND="$APPEND $add"
	fi
fi
[ -n "$EXTRA_APPEND" ] && APPEND="$APPEND $EXTRA_APPEND"
if [ "$ACCEL" = tcg ] && [[ "$APPEND" != *tsc_early_khz=* ]]; then
	APPEND="$APPEND tsc_early_khz=$TSC_KHZ"
fi
[ -n "$MACHINE" ] || MACHINE="$(man .boot.machine)"
[ -n "$MACHINE" ] || MACHINE="microvm,acpi=off"
if [ -z "$CPU" ]; then
	if [ "$ACCEL" = tcg ]; then CPU="$(man .boot.cpu_tcg)"; else CPU="$(man .boot.cpu_kvm)"; fi
	CPU="${CPU:-qemu64}"
fi
[ -r "$KERNEL" ] || { echo "bench-boot.sh: kernel not found: $KERNEL" >&2; exit 1; }
[ -r "$INITRD" ] || { echo "bench-boot.sh: initrd not found: $INITRD" >&2; exit 1; }

QEMU=(qemu-system-x86_64 -M "$MACHINE" -accel "$ACCEL" -cpu "$CPU" -m "$MEM" -smp "$SMP"
	-nodefaults -no-user-config -display none -serial stdio -no-reboot
	-kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND" "${EXTRA_QEMU[@]}")

now_us() { local t="${EPOCHREALTIME/./}"; echo "$t"; }
walls=() ups=()
TMPD="$(mktemp -d)"
trap 'rm -rf "$TMPD"' EXIT
for i in $(seq 1 "$N"); do
	log="$TMPD/console.$i"
	t0="$(now_us)"
	# Run QEMU with its stdout on a pipe; read lines until the marker.
	exec 3< <(exec timeout "$TIMEOUT" "${QEMU[@]}" </dev/null 2>&1)
	qpid=$!
	t1="" up=""
	while IFS= read -r -u 3 line; do
		echo "$line" >> "$log"
		if [[ "$line" == *"$MARKER"* ]]; then
			t1="$(now_us)"
			up="$(sed -n 's/.*uptime=\([0-9.]*\).*/\1/p' <<<"$line")"
			break
		fi
	done
	# Drain the rest of the console (QEMU exits itself: the test init reboots
	# and QEMU runs with -no-reboot); kill it after 5 s if it does not.
	( sleep 5; kill "$qpid" 2>/dev/null ) </dev/null >/dev/null 2>&1 & killer=$!
	cat <&3 >> "$log" || true
	exec 3<&-
	kill "$killer" 2>/dev/null || true
	wait "$killer" 2>/dev/null || true
	if [ -z "$t1" ]; then
		echo "run $i: marker '$MARKER' not seen; console tail:" >&2
		tail -20 "$log" >&2
		exit 1
	fi
	ms=$(( (t1 - t0) / 1000 ))
	walls+=("$ms"); ups+=("${up:-0}")
	echo "run $i: ${ms} ms wall, guest uptime ${up:-?} s"
	[ "$VERBOSE" = 1 ] && [ "$i" = 1 ] && tr -d '\r' < "$log"
done

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
smin() { printf '%s\n' "$@" | sort -g | sed -n 1p; }
smax() { printf '%s\n' "$@" | sort -g | tail -1; }
echo "${LABEL:-boot}  median=$(median "${walls[@]}")ms min=$(smin "${walls[@]}")ms max=$(smax "${walls[@]}")ms guest_uptime_median=$(median "${ups[@]}")s n=$N"
echo "  qemu: ${QEMU[*]}"
