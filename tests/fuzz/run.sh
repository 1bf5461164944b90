#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Builds the fuzzer with clang (ASan + UBSan + libFuzzer) in build-fuzz/ and
# runs it for a bounded number of inputs from a fresh seed corpus.
#   bash tests/fuzz/run.sh [RUNS]     (default 200000)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-200000}
CC=${CC:-clang-14} cmake -S . -B build-fuzz -DKVP_FUZZ=ON -DKVP_SANITIZE=ON \
	-DKVP_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target fuzz_dispatch fuzz_seeds
corpus=build-fuzz/corpus
rm -rf "$corpus" && mkdir -p "$corpus"
build-fuzz/tests/fuzz/fuzz_seeds "$corpus"
build-fuzz/tests/fuzz/fuzz_dispatch -runs="$runs" -seed=1 -max_len=4096 \
	-print_final_stats=1 "$corpus" 2>&1 | tail -25
