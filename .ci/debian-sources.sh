#!/usr/bin/env bash
# debian-sources.sh SUITE: prints the host's apt sources for the Debian
# suite SUITE (binary packages only; one-line and deb822 files alike, as
# deb822), for mmdebstrap to read. Other repositories the host may have are
# left out. Exits 1 when the host has no source for the suite.
set -euo pipefail
suite="$1"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
{
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -r "$f" ] && awk -v s="$suite" '$1 == "deb" && $0 ~ ("[[:space:]]" s "([-/][^[:space:]]*)?[[:space:]]")' "$f"
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		# Stanzas of Types deb whose Suites name the suite.
		awk -v s="$suite" 'BEGIN { RS = ""; ORS = "\n\n" }
			$0 ~ ("(^|\n)Types:[^\n]*deb([ \t]|\n|$)") && $0 ~ ("(^|\n)Suites:[^\n]*[ \t]" s "([-/][^ \t\n]*)?([ \t]|\n|$)") {
				gsub(/(^|\n)#[^\n]*/, ""); sub(/^\n/, ""); sub(/Types:[^\n]*/, "Types: deb"); print }' "$f"
	done
} > "$out"
if ! grep -qE '^(deb |Types:)' "$out"; then
	echo "debian-sources.sh: no Debian $suite source in /etc/apt/sources.list{,.d/}" >&2
	exit 1
fi
cat "$out"
