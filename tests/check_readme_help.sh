#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The docs' copy of `kvpoold --help` (docs/service.md) must be the daemon's
# own: a setting added, removed or reworded in service/config/config.c fails here
# until the page says the same. With --write, the page's block is rewritten
# from the daemon's help instead (then review and commit the change).
# Usage: check_readme_help.sh KVPOOLD PAGE [--write]
set -eu
kvpoold=$1
readme=$2
write=${3:-}
tmp=${TMPDIR:-/tmp}/kvp-readme-help.$$
trap 'rm -f "$tmp".want "$tmp".got "$tmp".page' EXIT
"$kvpoold" --help | grep '^  --' > "$tmp".want
# The first fenced block after the "kvpoold --help" paragraph.
block='/`kvpoold --help` \(each setting/ {armed = 1}'
if [ "$write" = --write ]; then
	awk -v want="$tmp".want "$block"'
	     armed && !done && /^```/ {
	         print
	         if (!inside) { inside = 1; while ((getline l < want) > 0) print l; next }
	         inside = 0; done = 1; next }
	     inside {next}
	     {print}' "$readme" > "$tmp".page
	if ! grep -q '^  --' "$tmp".page; then
		echo "$readme: no kvpoold --help block found to rewrite"
		exit 1
	fi
	cat "$tmp".page > "$readme"
	echo "$readme: kvpoold --help block rewritten ($(wc -l < "$tmp".want) settings)"
	exit 0
fi
awk "$block"'
     armed && /^```/ {if (inside) exit; inside = 1; next}
     inside && /^  --/ {print}' "$readme" > "$tmp".got
if ! diff -u "$tmp".want "$tmp".got; then
	echo "$readme's kvpoold --help block differs from the daemon's (- daemon, + $readme)"
	echo "rewrite it from the daemon: sh tests/check_readme_help.sh $kvpoold $readme --write"
	exit 1
fi
echo "$readme's kvpoold --help block matches ($(wc -l < "$tmp".want) settings)"
