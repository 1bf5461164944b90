#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Builds kvpool and runs every test (CTest drives the cmocka programs).
#   bash tests/run.sh                   plain build in build/
#   KVP_SANITIZE=1 bash tests/run.sh    ASan + UBSan build in build-asan/
#   KVP_NO_VLLM=1 bash tests/run.sh     without the tests against vLLM 0.33
# Extra CMake arguments may follow, e.g. -DCMAKE_BUILD_TYPE=Debug.
set -eu
cd "$(dirname "$0")/.."
if [ "${KVP_SANITIZE:-0}" = 1 ]; then
	dir=build-asan
	set -- -DKVP_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug "$@"
	export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
	export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
	dir=build
fi
# vLLM 0.33 from PyPI in a cached environment, for the tests against vLLM
# (KVP_NO_VLLM=1 leaves them out: they then report themselves skipped).
# Mooncake Store beside it, for the cluster tier's test (docs/cluster.md).
vllm_py=""
mooncake=""
if [ "${KVP_NO_VLLM:-0}" != 1 ] && [ "${KVP_SANITIZE:-0}" != 1 ]; then
	vllm_py="$(sh tests/vllm/env.sh)/bin/python"
	mooncake="$(sh tests/cluster/env.sh)"
fi
cmake -S . -B "$dir" -DKVP_VLLM_PYTHON="$vllm_py" -DKVP_MOONCAKE_VENV="$mooncake" "$@"
cmake --build "$dir" -j "$(nproc)"
ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" 2>&1
