#!/bin/bash
# run-tests.sh: standalone checks of the guest image with the test init.
#
# Usage: guest/image/testinit/run-tests.sh [--bench N] [--no-repro]
#
#  1. builds testinit (static C) and the image with it as /init, into a temp dir
#     (the kernel comes from the cache; a cold cache builds it first)
#  2. boots it under QEMU microvm (TCG) with the devices the product uses and
#     checks the guest sees them: virtio-serial port by name, virtio-blk,
#     virtio-scsi host, virtio-rng as hw_random, virtio-net, cgroup v2
#     controllers, filesystems, crun in the image
#  3. hot-plugs a scsi-hd onto the virtio-scsi-device through QMP
#     (blockdev-add + device_add) and checks /sys/class/block/sda appears
#  4. builds the image a second time and compares the sha256 of every output
#  5. with --bench N: bench-boot.sh with N runs
# Prints "N passed, N failed" at the end; exits non-zero on any failure.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
IMG="$(cd "$HERE/.." && pwd)"
BENCH=0 REPRO=1
while [ $# -gt 0 ]; do
	case "$1" in
	--bench) BENCH="$2"; shift 2 ;;
	--no-repro) REPRO=0; shift ;;
	*) echo "usage: $0 [--bench N] [--no-repro]" >&2; exit 2 ;;
	esac
done

PASS=0 FAIL=0
ok() { echo "PASS: $*"; PASS=$((PASS + 1)); }
bad() { echo "FAIL: $*"; FAIL=$((FAIL + 1)); }

W="$(mktemp -d /tmp/cocoon-image-test.XXXXXX)"
QPIDS=()
cleanup() {
	for p in "${QPIDS[@]}"; do kill "$p" 2>/dev/null; done
	rm -rf "$W"
}
trap cleanup EXIT

command -v qemu-system-x86_64 >/dev/null || { echo "qemu-system-x86_64 missing (apt-get install qemu-system-x86)"; exit 1; }
gcc -static -Os -Wall -o "$W/testinit" "$HERE/testinit.c" || { echo "cannot build testinit"; exit 1; }
"$IMG/build.sh" "$W/testinit" "$W/out" || { echo "image build failed"; exit 1; }
K="$W/out/vmlinux" I="$W/out/initrd.img"

# The host side of the command line (what the shim must compute).
TSC_KHZ="$(awk -F: '/^bogomips/ {gsub(/ /,"",$2); printf "%d\n", $2*500 + 0.5; exit}' /proc/cpuinfo)"
LPJ=$(( TSC_KHZ * 1000 / $(jq -r .kernel.hz "$W/out/manifest.json") ))
CMDLINE="$(jq -r .kernel.cmdline "$W/out/manifest.json") $(jq -r .boot.cmdline_append_tcg "$W/out/manifest.json" |
	sed "s/{tsc_khz}/$TSC_KHZ/; s/{lpj}/$LPJ/")"
MACHINE="$(jq -r .boot.machine "$W/out/manifest.json")"
CPU="$(jq -r .boot.cpu_tcg "$W/out/manifest.json")"
base=(qemu-system-x86_64 -M "$MACHINE" -accel tcg -cpu "$CPU" -m 256 -smp 2
	-nodefaults -no-user-config -display none -no-reboot -kernel "$K" -initrd "$I")

# --- 2. devices -------------------------------------------------------------------
truncate -s 64M "$W/vda.img"
timeout 120 "${base[@]}" -serial "file:$W/dev.log" -append "$CMDLINE cocoon.testinit=devices" \
	-device virtio-serial-device \
	-chardev socket,id=agent,path="$W/agent.sock",server=on,wait=off \
	-device virtserialport,chardev=agent,name=io.cocoon.agent.0 \
	-device virtio-scsi-device,id=scsi0 -device virtio-rng-device \
	-drive if=none,id=d0,file="$W/vda.img",format=raw -device virtio-blk-device,drive=d0 \
	-netdev user,id=n0 -device virtio-net-device,netdev=n0 \
	-device virtio-balloon-device >/dev/null 2>"$W/dev.err"
tr -d '\r' < "$W/dev.log" > "$W/dev.txt"
expect() { # expect <description> <grep -E pattern>
	if grep -qE "$2" "$W/dev.txt"; then ok "$1"; else bad "$1 (no /$2/ in console)"; fi
}
expect "boots to PID 1" 'COCOON-TESTINIT-READY'
expect "virtio-serial port named io.cocoon.agent.0" 'virtio-port: vport[0-9]+p[0-9]+ name=io\.cocoon\.agent\.0$'
expect "virtio-blk disk vda" 'block: vda size=131072'
expect "virtio-scsi host" 'scsi-host: host[0-9]+ proc_name=virtio_scsi'
expect "virtio-rng is hw_random" 'hwrng: virtio_rng'
expect "virtio-net eth0" 'net: eth0 address='
expect "virtio-balloon bound" 'virtio-dev: virtio[0-9]+ device=0x0005'
expect "two vCPUs online" 'cpus: 0-1'
expect "cgroup v2 controllers" 'cgroup2-controllers: cpuset cpu io memory hugetlb pids'
expect "filesystems ext4 erofs overlay virtiofs" 'filesystems:.* ext4 .*virtiofs overlay erofs'
expect "crun in the image" 'crun: present'
expect "crun runs (static, no loader in the image)" '^crun version [0-9]'
expect "crun --version exits 0" 'crun-exit: 0'
# noapictimer leaves the tick to the PIT: timers must fire and keep time.
expect "timer interrupts arrive, sleeps last as long as asked" 'timer: sleep200ms monotonic=(19[0-9]|2[0-4][0-9])ms'
expect "PIT timer interrupts counted" 'irq: +0: +[1-9][0-9]*.*timer'
expect "kernel is ours" 'kernel: Linux version [0-9.]+-cocoon'
expect "device check completed" 'COCOON-TESTINIT-DONE'

# --- 3. SCSI hot-plug through QMP ------------------------------------------------------
truncate -s 32M "$W/hot.img"
mkfifo "$W/qmp.in" "$W/qmp.out"
"${base[@]}" -serial "file:$W/hot.log" -append "$CMDLINE cocoon.testinit=hotplug" \
	-device virtio-scsi-device,id=scsi0 \
	-chardev pipe,id=qmp,path="$W/qmp" -mon chardev=qmp,mode=control >/dev/null 2>"$W/hot.err" &
QPIDS+=($!)
exec 4<>"$W/qmp.in"
exec 5<>"$W/qmp.out"
seen=0
for _ in $(seq 600); do
	grep -q 'waiting for sda' "$W/hot.log" 2>/dev/null && { seen=1; break; }
	sleep 0.1
done
if [ "$seen" = 1 ]; then
	printf '%s\n' '{"execute":"qmp_capabilities"}' \
		"{\"execute\":\"blockdev-add\",\"arguments\":{\"driver\":\"raw\",\"node-name\":\"hd1\",\"file\":{\"driver\":\"file\",\"filename\":\"$W/hot.img\"}}}" \
		'{"execute":"device_add","arguments":{"driver":"scsi-hd","drive":"hd1","bus":"scsi0.0","id":"sd1"}}' >&4
	for _ in $(seq 300); do
		grep -qE 'hotplug: (sda|timeout)' "$W/hot.log" && break
		sleep 0.1
	done
fi
if tr -d '\r' < "$W/hot.log" | grep -q 'hotplug: sda size=65536'; then
	ok "scsi-hd hot-plugged via QMP appears as sda"
else
	bad "scsi-hd hot-plug (console: $(tr -d '\r' < "$W/hot.log" | tail -3 | tr '\n' '|'))"
fi
exec 4>&- 5<&-

# --- 4. reproducibility ------------------------------------------------------------
if [ "$REPRO" = 1 ]; then
	"$IMG/build.sh" "$W/testinit" "$W/out2" 2>/dev/null
	for f in vmlinux initrd.img manifest.json; do
		a="$(sha256sum < "$W/out/$f" | cut -c1-64)" b="$(sha256sum < "$W/out2/$f" 2>/dev/null | cut -c1-64)"
		if [ "$a" = "$b" ]; then ok "reproducible $f ($a)"; else bad "$f differs between builds: $a vs $b"; fi
	done
fi

# --- 5. bench -----------------------------------------------------------------------
if [ "$BENCH" -gt 0 ]; then
	"$IMG/bench-boot.sh" -k "$K" -i "$I" -n "$BENCH" -M "$MACHINE" -c "$CPU" \
		-a "$CMDLINE" -l "testinit" || bad "bench"
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
