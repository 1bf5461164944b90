#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The main job for a newcomer: kvpoold on its embedded default (host-memory
# pool, local ipc:// endpoint), a scheduler demo against it, the pool's
# stats from kvpoolctl, then a graceful SIGTERM.
set -eu
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
"$B/service/kvpoold" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
i=0
until "$B/clients/c/kvpoolctl" --timeout-ms 200 info >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 50 ] || { echo "kvpoold did not start" >&2; exit 1; }
	sleep 0.1
done
echo
"$B/clients/c/kvpool-demo"
echo
echo "\$ kvpoolctl stats"
"$B/clients/c/kvpoolctl" stats
echo
kill -TERM $pid
wait $pid
trap - EXIT
