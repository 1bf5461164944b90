#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The main job for a newcomer: kvpoold on its embedded default (host-memory
# pool, local ipc:// endpoint), a scheduler demo against it, the pool's
# stats from kvpoolctl, then a graceful SIGTERM. A second, short act runs
# the same demo on a gpt-oss-like hybrid pool (full attention beside a
# 128-token sliding window).
set -eu
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
pid=
trap '[ -z "$pid" ] || kill $pid 2>/dev/null || true' EXIT

# start POOL FLAGS...: starts kvpoold and waits until POOL answers.
start() {
	pool=$1
	shift
	"$B/service/kvpoold" "$@" &
	pid=$!
	i=0
	until "$B/clients/c/kvpoolctl" --timeout-ms 200 --pool "$pool" info >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -lt 50 ] || { echo "kvpoold did not start" >&2; exit 1; }
		sleep 0.1
	done
}

stop() {
	kill -TERM $pid
	wait $pid
	pid=
}

start default
echo
"$B/clients/c/kvpool-demo"
echo
echo "\$ kvpoolctl stats"
"$B/clients/c/kvpoolctl" stats
echo
stop

HYBRID='name=gptoss,blocks=1024,groups=full:16+sliding_window:16:128'
echo
echo "\$ kvpoold --pool '$HYBRID'"
start gptoss --quiet --pool "$HYBRID"
echo
echo "\$ kvpoolctl --pool gptoss info"
"$B/clients/c/kvpoolctl" --pool gptoss info
echo
"$B/clients/c/kvpool-demo" ipc:///tmp/kvpool.ipc gptoss
echo
stop
trap - EXIT
