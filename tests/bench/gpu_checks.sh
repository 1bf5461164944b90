#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# What a lent GPU machine checks, in one go (tests/bench/README.md, "On a
# lent GPU"): the CUDA executor against the cpu one, the data plane on a
# cuda pool, the offloading workers' copies on CUDA tensors through the
# pinned region (test_kv_copy), then the GPU area's benchmarks, whose
# figures go to OUT/gpu.jsonl for `report.py render`. Every step runs, each
# under a time limit; the exit status says whether any failed.
#   sh tests/bench/gpu_checks.sh OUT      (from the root, with ./build-gpu built)
set -u
out=${1:?usage: gpu_checks.sh OUT}
cd "$(dirname "$0")/../.." || exit 2
mkdir -p "$out"
root=$(pwd)
build=$root/build-gpu
export PYTHONUNBUFFERED=1
failed=""
step() {
	secs=$1
	shift
	echo "== $*"
	if ! timeout "$secs" "$@"; then
		echo "== FAILED: $*"
		failed="$failed
  $*"
	fi
}
nvidia-smi -L
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
"device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
missing=$(ldd "$build/service/kvpoold" "$build/clients/c/libkvpool.so" | grep "not found")
[ -z "$missing" ] || { echo "libraries missing (LD_LIBRARY_PATH?):"; echo "$missing"; exit 2; }
step 120 env KVP_TEST_SEED=7 "$build/tests/test_executor_cuda"
step 120 env KVP_TEST_EXECUTOR=cuda "$build/tests/test_data_plane"
step 120 env KVPOOL_LIB="$build/clients/c/libkvpool.so" KVPOOLD="$build/service/kvpoold" \
	sh -c 'cd clients/python && python3 -m pytest -q -p no:cacheprovider -rs tests/vllm033/test_kv_copy.py'
step 360 python3 tests/bench/report.py run --only gpu --out "$out/gpu.jsonl"
if [ -n "$failed" ]; then
	echo "gpu_checks: failed:$failed"
	exit 1
fi
echo "gpu_checks: every step passed; figures in $out/gpu.jsonl"
