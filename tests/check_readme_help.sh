#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The docs' copy of `kvpoold --help` (docs/service.md) must be the daemon's
# own: a setting added, removed or reworded in service/config.c fails here
# until the page says the same. Usage: check_readme_help.sh KVPOOLD PAGE
set -eu
kvpoold=$1
readme=$2
tmp=${TMPDIR:-/tmp}/kvp-readme-help.$$
trap 'rm -f "$tmp".want "$tmp".got' EXIT
"$kvpoold" --help | grep '^  --' > "$tmp".want
# The first fenced block after the "kvpoold --help" paragraph.
awk '/`kvpoold --help` \(each setting/ {armed = 1}
     armed && /^```/ {if (inside) exit; inside = 1; next}
     inside && /^  --/ {print}' "$readme" > "$tmp".got
if ! diff -u "$tmp".want "$tmp".got; then
	echo "$readme's kvpoold --help block differs from the daemon's (- daemon, + $readme)"
	exit 1
fi
echo "$readme's kvpoold --help block matches ($(wc -l < "$tmp".want) settings)"
