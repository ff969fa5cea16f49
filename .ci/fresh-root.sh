#!/usr/bin/env bash
# fresh-root.sh: build the binaries and the guest image inside a fresh,
# minimal Debian 12 root, from what `make deps` installs and nothing else,
# then compare the image with the host's build/guest/manifest.json.
# `make check-fresh` runs it, and .ci/run after `make test`.
#
# Usage: .ci/fresh-root.sh
#
#  0. the host's own image, the reference: `make build guest` in this tree
#     (cache hits, seconds, once make guest ran), when the tree has no local
#     changes; with local changes the host's image is not HEAD's, and there
#     is nothing to compare with.
#  1. root: `mmdebstrap --variant=apt --include=make bookworm` (Debian's
#     essential packages, apt, and make to run `make deps` with; nothing
#     else) from the host's Debian apt sources, cached as
#     $CACHE/fresh-root/<key>.tar; key = sha256 of the mmdebstrap command
#     line, the sources it is given and mmdebstrap's version. A tarball older
#     than FRESH_ROOT_MAX_AGE_DAYS is made anew (the mirror moves on).
#  2. a work root unpacked from it, into which only this is carried:
#       /usr/local/go            the Go toolchain (read-only bind mount)
#       /root/go/pkg/mod         the host's Go module download cache (bind mount)
#       /var/cache/apt/archives  $CACHE/fresh-root/debs: downloaded .debs (bind mount)
#       /var/cache/cocoon/kernel the kernel cache entry of this tree's key (copied)
#     plus the host's resolv.conf and the apt options that reach its mirror.
#     No Go build cache, no crun, nothing else that was built on the host.
#  3. `git archive` of HEAD (or FRESH_ROOT_REV) as /root/cocoon; then in a
#     chroot with /proc, /sys and /dev: make deps; make build; make guest.
#  4. the image against the host's build/guest/manifest.json: each of the
#     kernel, crun, the agent, the initrd and the manifest must have the
#     host's digest when it was built from the same inputs (the same cache
#     key, the same source tree); a difference from the same inputs is a
#     reproducibility bug and fails the check, one from other inputs (say,
#     newer packages on the mirror than on the host) is reported.
#  5. everything unmounted, also on failure or interrupt, and the work root
#     removed; the cached tarball and .debs stay.
#
# Prints how long each step took; the whole output of the builds in the root
# goes to build/fresh-root.log, and the log of a kernel or crun build that
# failed there to build/fresh-root-logs/.
#
# Environment:
#   COCOON_CACHE             cache root (default /var/cache/cocoon)
#   FRESH_ROOT_SUITE         Debian suite (default bookworm)
#   FRESH_ROOT_MAX_AGE_DAYS  make the root tarball anew after this many days (default 7)
#   FRESH_ROOT_REV           the commit to build (default HEAD)
#   FRESH_ROOT_KERNEL=cold   carry no kernel cache in: the root builds the kernel
#                            (+9-16 min on 2 cores)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${COCOON_CACHE:-/var/cache/cocoon}"
SUITE="${FRESH_ROOT_SUITE:-bookworm}"
MAX_AGE_DAYS="${FRESH_ROOT_MAX_AGE_DAYS:-7}"
REV="${FRESH_ROOT_REV:-HEAD}"
STORE="$CACHE/fresh-root"
DEBS="$STORE/debs"
LOG="$REPO/build/fresh-root.log"

log() { echo "fresh-root: $*"; }
die() { echo "fresh-root: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, chroot, mounts)"
command -v git >/dev/null || die "git missing (make deps installs it)"
git -C "$REPO" rev-parse -q --verify "$REV^{commit}" >/dev/null || die "not a commit: $REV"
GOROOT_HOST=/usr/local/go
[ -x "$GOROOT_HOST/bin/go" ] || die "no Go toolchain in $GOROOT_HOST"
GOMODCACHE_HOST="$("$GOROOT_HOST/bin/go" env GOMODCACHE)"
[ -n "$GOMODCACHE_HOST" ] || die "go env GOMODCACHE is empty"

# --- timing --------------------------------------------------------------------
TIMES=()
T_ALL=$(date +%s)
T_STEP=0 STEP=""
step() { # step NAME: ends the running step, starts NAME
	local now; now=$(date +%s)
	[ -n "$STEP" ] && { TIMES+=("$(printf '%-28s %4ds' "$STEP" $((now - T_STEP)))"); log "($STEP: $((now - T_STEP))s)"; }
	STEP="$1" T_STEP=$now
	[ -n "$STEP" ] && log "--- $STEP"
	return 0
}
print_times() {
	step ""
	echo "fresh-root: times"
	local t; for t in "${TIMES[@]}"; do echo "  $t"; done
	printf '  %-28s %4ds\n' total $(( $(date +%s) - T_ALL ))
}

# --- the work root and its clean-up ----------------------------------------------
ROOT="" SRC=""
mounts_under() { # mount points at or below $1, deepest first
	awk -v r="$1" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r
}
cleanup() {
	local rc=$? m p left
	trap - EXIT INT TERM
	set +e
	[ -n "$STEP" ] && step "clean up"
	[ -n "$SRC" ] && rm -f "$SRC"
	if [ -n "$ROOT" ] && [ -d "$ROOT" ]; then
		# A failed kernel or crun build's log outlives the root.
		if [ "$rc" != 0 ]; then
			for f in "$ROOT"/var/cache/cocoon/*/work-*/build.log; do
				[ -f "$f" ] || continue
				mkdir -p "$REPO/build/fresh-root-logs"
				m="$(basename "$(dirname "$(dirname "$f")")")"
				cp "$f" "$REPO/build/fresh-root-logs/$m-build.log" &&
					echo "fresh-root: the root's $m build log: build/fresh-root-logs/$m-build.log" >&2
			done
		fi
		# Whatever still runs inside the root (nothing should): ended by pid.
		for p in /proc/[0-9]*; do
			[ "$(readlink "$p/root" 2>/dev/null)" = "$ROOT" ] && kill -9 "${p#/proc/}" 2>/dev/null || true
		done
		for m in $(mounts_under "$ROOT"); do
			umount "$m" 2>/dev/null || umount -l "$m" || true
		done
		left="$(mounts_under "$ROOT")"
		if [ -n "$left" ]; then
			echo "fresh-root: error: still mounted, $ROOT left in place:" >&2
			echo "$left" >&2
			rc=1
		else
			rm -rf --one-file-system "$ROOT"
		fi
	fi
	[ -n "$STEP" ] && print_times
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$STORE" "$DEBS/partial" "$REPO/build"
exec 7>"$STORE/.lock"
flock -n 7 || { log "another fresh-root check runs; waiting for it"; flock 7; }
: > "$LOG"
rm -rf "$REPO/build/fresh-root-logs"

# --- 0. the host's image, to compare with -----------------------------------------
HMAN="$REPO/build/guest/manifest.json"
COMPARE=1
if [ -n "$(git -C "$REPO" status --porcelain)" ]; then
	log "this tree has local changes: the host's image is not HEAD's, nothing to compare with"
	COMPARE=0
else
	step "host image"
	echo "=== host: make build guest" >>"$LOG"
	PATH="$GOROOT_HOST/bin:$PATH" make -C "$REPO" build guest >>"$LOG" 2>&1 || { tail -20 "$LOG" >&2; die "make build guest failed on the host, see $LOG"; }
fi

# --- 1. the root tarball -----------------------------------------------------------
step "root tarball"
# The host's Debian sources for the suite.
SRC="$(mktemp)"
bash "$REPO/.ci/debian-sources.sh" "$SUITE" > "$SRC" || die "no Debian $SUITE source on the host"
# What the host's apt needs to reach that mirror (a proxy, a snapshot's
# expired Release files); nothing that changes which packages get installed.
APTOPTS=()
while IFS= read -r line; do
	APTOPTS+=(--aptopt="${line%;}")
done < <(apt-config dump | grep -E '^Acquire::(Check-Valid-Until|Check-Date|https?::Proxy|ftp::Proxy)( |::)' || true)

MMDEB=(mmdebstrap --variant=apt --include=make --mode=root --format=tar "${APTOPTS[@]}"
	--dpkgopt=force-unsafe-io --skip=essential/unlink
	--setup-hook='mkdir -p "$1"/var/cache/apt/archives/'
	--setup-hook="sync-in $DEBS /var/cache/apt/archives/"
	--customize-hook="sync-out /var/cache/apt/archives $DEBS"
	"$SUITE")
if ! command -v mmdebstrap >/dev/null; then
	log "installing mmdebstrap"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >>"$LOG" 2>&1 || {
		apt-get update -qq >>"$LOG" 2>&1 &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >>"$LOG" 2>&1
	} || die "could not install mmdebstrap, see $LOG"
fi
KEY="$( { printf '%s\n' "${MMDEB[@]}"; echo "--- sources"; cat "$SRC"; mmdebstrap --version; } | sha256sum | cut -c1-24)"
TARBALL="$STORE/$SUITE-$KEY.tar"
if [ -s "$TARBALL" ] && [ -z "$(find "$TARBALL" -mtime +"$MAX_AGE_DAYS")" ]; then
	log "cached: $TARBALL (made $(date -u -r "$TARBALL" '+%F %H:%M UTC'))"
else
	log "mmdebstrap --variant=apt $SUITE -> $TARBALL"
	rm -f "$TARBALL.tmp"
	if ! "${MMDEB[@]}" "$TARBALL.tmp" "$SRC" >>"$LOG" 2>&1; then
		rm -f "$TARBALL.tmp"
		tail -20 "$LOG" >&2
		die "mmdebstrap failed, see $LOG"
	fi
	mv -f "$TARBALL.tmp" "$TARBALL"
	# Only the current tarball is kept.
	find "$STORE" -maxdepth 1 -name '*.tar' ! -path "$TARBALL" -delete
fi
rm -f "$SRC"; SRC=""

# --- 2. the work root --------------------------------------------------------------
step "work root"
ROOT="$(mktemp -d /var/tmp/cocoon-fresh-root.XXXXXX)"
chmod 0755 "$ROOT"
tar -C "$ROOT" --numeric-owner -xf "$TARBALL"
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
# No service starts in the root (containerd's postinst, say).
printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"
chmod 0755 "$ROOT/usr/sbin/policy-rc.d"
mount -t proc proc "$ROOT/proc"
mount -t sysfs sysfs "$ROOT/sys"
mount --rbind /dev "$ROOT/dev"
mount --make-rslave "$ROOT/dev"
mkdir -p "$ROOT/usr/local/go" "$ROOT/root/go/pkg/mod" "$GOMODCACHE_HOST" "$ROOT/var/cache/apt/archives"
mount --bind -o ro "$GOROOT_HOST" "$ROOT/usr/local/go"
mount --bind "$GOMODCACHE_HOST" "$ROOT/root/go/pkg/mod"
mount --bind "$DEBS" "$ROOT/var/cache/apt/archives"
KCACHE="$CACHE/kernel"
n=0
if [ "${FRESH_ROOT_KERNEL:-}" != cold ]; then
	mkdir -p "$ROOT/var/cache/cocoon/kernel"
	# The entry this tree's kernel.sh uses (the root's has the same key when
	# its packages are the host's); every complete one if it cannot tell.
	hkey="$("$REPO/guest/image/kernel.sh" --print-key 2>/dev/null || true)"
	for d in "$KCACHE"/*/; do
		d="${d%/}"
		case "$(basename "$d")" in work-*|.tmp-*) continue ;; esac
		[ -z "$hkey" ] || [ "$(basename "$d")" = "$hkey" ] || continue
		[ -s "$d/vmlinux" ] && [ -x "$d/gen_init_cpio" ] || continue
		cp -a "$d" "$ROOT/var/cache/cocoon/kernel/"
		n=$((n + 1))
	done
fi
log "carried in: Go $("$GOROOT_HOST/bin/go" env GOVERSION), GOMODCACHE $GOMODCACHE_HOST," \
	"$(find "$DEBS" -maxdepth 1 -name '*.deb' | wc -l) cached .debs, $n kernel cache entries"
VERSION="$(git -C "$REPO" describe --tags --always "$REV")"
TREE="$(git -C "$REPO" rev-parse "$REV^{tree}")"
git -C "$REPO" archive --format=tar --prefix=cocoon/ "$REV" | tar -C "$ROOT/root" -xf -
log "source: $REV ($VERSION, tree ${TREE:0:12}) in /root/cocoon"

in_root() { # in_root CMD: runs CMD with bash in the root, as a fresh login would have it
	chroot "$ROOT" /usr/bin/env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb \
		PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		/bin/bash -c "cd /root/cocoon && $1" 7>&-
}
run_step() { # run_step NAME CMD: a build step in the root; its messages shown, its output logged
	step "$1"
	echo "=== $1: $2" >>"$LOG"
	local rc from
	from=$(( $(wc -l < "$LOG") + 1 ))
	set +e
	in_root "$2" </dev/null 2>&1 | tee -a "$LOG" | { grep --line-buffered -E '^(installing:|[a-z]+\.sh: )' || true; }
	rc=${PIPESTATUS[0]}
	set -e
	if [ "$rc" != 0 ]; then
		echo "fresh-root: --- the last lines of '$2' (all in $LOG):" >&2
		tail -n +"$from" "$LOG" | tail -25 | sed 's/^/  | /' >&2
		die "'$2' failed in the fresh $SUITE root (exit $rc); a package missing from make deps?"
	fi
}

# --- 3. the build ------------------------------------------------------------------
# The archive has no .git for the Makefile to take VERSION from: it comes
# from the environment, as git describe would give it (not from make's
# command line, which reaches every make below through MAKEFLAGS).
run_step "make deps" "make deps"
run_step "make build" "VERSION=$VERSION make build"
run_step "make guest" "VERSION=$VERSION make guest"

# --- 4. compare --------------------------------------------------------------------
step "compare"
RMAN="$ROOT/root/cocoon/build/guest/manifest.json"
[ -s "$RMAN" ] || die "the root's make guest wrote no manifest"
cp "$RMAN" "$REPO/build/fresh-root-manifest.json"
if [ "$COMPARE" = 1 ]; then
	# The inputs of each component on both sides.
	r_kernel="$(in_root 'guest/image/kernel.sh --print-key' 2>>"$LOG")"
	r_crun="$(in_root 'guest/image/crun.sh --print-key' 2>>"$LOG")"
	r_bb="$(chroot "$ROOT" dpkg-query -W -f='${Version}' busybox-static)"
	h_kernel="$("$REPO/guest/image/kernel.sh" --print-key 2>>"$LOG" || echo unknown)"
	h_crun="$("$REPO/guest/image/crun.sh" --print-key 2>>"$LOG" || echo unknown)"
	h_bb="$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || echo none)"
	r_tree="tree $TREE, VERSION $VERSION"
	h_tree="tree $(git -C "$REPO" rev-parse 'HEAD^{tree}'), VERSION $(git -C "$REPO" describe --tags --always --dirty)"
	fail=0
	verdict() { # verdict NAME HOST_SHA ROOT_SHA HOST_INPUTS ROOT_INPUTS
		if [ "$2" = "$3" ]; then
			printf '  %-9s same      %s\n' "$1" "${2:0:16}"
		elif [ "$4" = "$5" ]; then
			printf '  %-9s DIFFERENT host %s, root %s, from the same inputs: not reproducible\n' "$1" "${2:0:16}" "${3:0:16}"
			fail=1
		else
			printf '  %-9s different host %s, root %s (other inputs: host %s; root %s)\n' \
				"$1" "${2:0:16}" "${3:0:16}" "$4" "$5"
		fi
	}
	j() { jq -r "$1" "$2"; }
	log "the root's image against the host's $HMAN:"
	verdict kernel "$(j .kernel.sha256 "$HMAN")" "$(j .kernel.sha256 "$RMAN")" "key $h_kernel" "key $r_kernel"
	verdict crun "$(j .components.oci_runtime_sha256 "$HMAN")" "$(j .components.oci_runtime_sha256 "$RMAN")" "key $h_crun" "key $r_crun"
	verdict agent "$(j .components.agent_sha256 "$HMAN")" "$(j .components.agent_sha256 "$RMAN")" "$h_tree" "$r_tree"
	h_all="$h_tree; kernel $h_kernel; crun $h_crun; busybox $h_bb"
	r_all="$r_tree; kernel $r_kernel; crun $r_crun; busybox $r_bb"
	verdict initrd "$(j .initrd.sha256 "$HMAN")" "$(j .initrd.sha256 "$RMAN")" "$h_all" "$r_all"
	verdict manifest "$(sha256sum < "$HMAN" | cut -c1-64)" "$(sha256sum < "$RMAN" | cut -c1-64)" "$h_all" "$r_all"
	[ "$fail" = 0 ] || die "the fresh root built different bytes from the same inputs"
fi
log "ok: make deps && make build guest work in a fresh $SUITE root"
