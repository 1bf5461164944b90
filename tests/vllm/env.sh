#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Makes (once) and prints the path of a virtual environment with vLLM 0.33.0
# from PyPI: the CPU build of torch 2.13 this machine kind keeps on disk,
# vLLM with --no-deps (its full install pulls CUDA kernels and several GB),
# and the pinned set of what its core imports (requirements.txt here). The
# environment is cached outside the clone (KVP_VLLM_VENV, default
# /var/cache/kvpool/vllm-0.33.0) and rebuilt only when requirements.txt
# changes, so CI pays the download once per machine.
#   VENV=$(sh tests/vllm/env.sh) && "$VENV/bin/python" -c 'import vllm'
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv=${KVP_VLLM_VENV:-/var/cache/kvpool/vllm-0.33.0}
stamp="$venv/.kvpool-stamp"
want=$(cat "$here/requirements.txt" "$0" | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c 'import vllm' 2>/dev/null; then
	echo "$venv"
	exit 0
fi
echo "tests/vllm/env.sh: building $venv (vLLM 0.33.0, torch 2.13.0 CPU)" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
/usr/bin/python3 -m venv "$venv" >&2
pip="$venv/bin/python -m pip --disable-pip-version-check -q"
$pip install torch==2.13.0 >&2
$pip install --no-deps -r "$here/requirements.txt" >&2
$pip install --no-deps vllm==0.33.0 >&2
"$venv/bin/python" -c 'import vllm.v1.core.sched.scheduler, vllm.distributed.kv_events' >&2
echo "$want" > "$stamp"
echo "$venv"
