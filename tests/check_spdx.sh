#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Every source file the project ships says its licence in its first lines.
# Usage: check_spdx.sh SOURCE_DIR. Prints each file without one; exit 1 if any.
set -u
cd "$1" || exit 1
missing=$(git ls-files 2>/dev/null | grep -E '\.(c|h|cu|proto|py|sh|mjs)$|(^|/)CMakeLists\.txt$|^\.ci/run$|(^|/)Dockerfile' |
	while IFS= read -r f; do
		head -n 3 "$f" | grep -q 'SPDX-License-Identifier: Apache-2.0' || echo "$f"
	done)
if [ -n "$missing" ]; then
	echo "no SPDX-License-Identifier in the first 3 lines of:"
	echo "$missing"
	exit 1
fi
echo "spdx: ok"
