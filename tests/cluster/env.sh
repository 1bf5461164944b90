#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Makes (once) and prints the path of a virtual environment with Mooncake
# Store's wheel from PyPI (pinned: its master, HTTP metadata server and
# Python client; the TCP transport runs on these machines), for the cluster
# tier's agent and tests (docs/cluster.md). Cached outside the clone
# (KVP_MOONCAKE_VENV, default /var/cache/kvpool/mooncake-<version>) and
# rebuilt only when this file changes.
#   VENV=$(sh tests/cluster/env.sh) && "$VENV/bin/mooncake_master" --help
set -eu
version=0.3.13.post1
venv=${KVP_MOONCAKE_VENV:-/var/cache/kvpool/mooncake-$version}
stamp="$venv/.kvpool-stamp"
want=$(sha256sum < "$0" | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
	"$venv/bin/python" -c 'import mooncake.store' 2>/dev/null; then
	echo "$venv"
	exit 0
fi
echo "tests/cluster/env.sh: building $venv (mooncake-transfer-engine-non-cuda $version)" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
/usr/bin/python3 -m venv "$venv" >&2
"$venv/bin/python" -m pip --disable-pip-version-check -q install \
	"mooncake-transfer-engine-non-cuda==$version" >&2
"$venv/bin/python" -c 'from mooncake.store import MooncakeDistributedStore' >&2
[ -x "$venv/bin/mooncake_master" ]
echo "$want" > "$stamp"
echo "$venv"
