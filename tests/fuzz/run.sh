#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Builds the fuzzers with clang (ASan + UBSan + libFuzzer) in build-fuzz/ and
# runs each for a bounded number of inputs from a fresh seed corpus: the
# request dispatcher for RUNS, the configuration loader for RUNS / 4, the
# admin HTTP endpoint (over loopback, so slower) for RUNS / 20.
#   bash tests/fuzz/run.sh [RUNS]     (default 200000)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-200000}
CC=${CC:-clang-14} cmake -S . -B build-fuzz -DKVP_FUZZ=ON -DKVP_SANITIZE=ON \
	-DKVP_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target fuzz_dispatch fuzz_config fuzz_admin fuzz_seeds
corpus=build-fuzz/corpus
rm -rf "$corpus" && mkdir -p "$corpus"
build-fuzz/tests/fuzz/fuzz_seeds "$corpus"
build-fuzz/tests/fuzz/fuzz_dispatch -runs="$runs" -seed=1 -max_len=4096 \
	-print_final_stats=1 "$corpus" 2>&1 | tail -25

# The configuration loader, seeded with a valid file, pool spec and flags
# (the first byte picks the door: see fuzz_config.c).
ccorpus=build-fuzz/corpus-config
rm -rf "$ccorpus" && mkdir -p "$ccorpus"
printf '\000rpc = ipc:///tmp/x.ipc\n# comment\npool = name=a,blocks=64,groups=full:16+sliding_window:16:128\nlease-ms = 5000\nkv-memory = 0.5\n' >"$ccorpus/file"
printf '\001name=a,blocks=64,block_size=16,caching=off;b:128:16' >"$ccorpus/env"
printf '\002--pool\000name=q,blocks=32,groups=full:16+mamba:64,hash_algo=sha256,seed=0\000--events\000none\000--log-format\000json' >"$ccorpus/flags"
printf '\003pool = name=x,blocks=0\nadmin = http://0.0.0.0:1\n' >"$ccorpus/check"
build-fuzz/tests/fuzz/fuzz_config -runs="$((runs / 4))" -seed=1 -max_len=2048 -timeout=10 \
	-print_final_stats=1 "$ccorpus" 2>&1 | tail -12

# The admin HTTP endpoint, seeded with well-formed, pipelined, chunked and
# truncated requests; each input goes over its own loopback connection.
acorpus=build-fuzz/corpus-admin
rm -rf "$acorpus" && mkdir -p "$acorpus"
printf 'GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n' >"$acorpus/get"
printf 'GET /metrics HTTP/1.0\r\n\r\nGET /readyz HTTP/1.1\r\nHost: b\r\nConnection: keep-alive\r\n\r\n' >"$acorpus/pipelined"
printf 'POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello' >"$acorpus/post"
printf 'GET /nope?x=%%00 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n' >"$acorpus/chunked"
printf 'GET /healthz HTTP/1.1\r\nHost: a\r\nX-Long: aaaaaaaaaaaaaaaaaaaaaaaa' >"$acorpus/truncated"
build-fuzz/tests/fuzz/fuzz_admin -runs="$((runs / 20))" -seed=1 -max_len=4096 -timeout=20 \
	-print_final_stats=1 "$acorpus" 2>&1 | tail -8
