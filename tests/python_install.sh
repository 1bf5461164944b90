#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# `pip install ./clients/python` offline into a fresh virtual environment
# (Debian's python3 refuses system-wide installs, PEP 668), then the
# installed package, imported from outside the tree, opens a session with a
# real kvpoold. Usage: python_install.sh PYTHON KVPOOLD LIBKVPOOL SOURCE_DIR
set -eu
PY=$1 KVPOOLD=$2 LIB=$3 SRC=$4
T=$(mktemp -d) DPID=""
trap '[ -z "$DPID" ] || kill $DPID 2>/dev/null; rm -rf "$T"' EXIT
"$PY" -m venv --without-pip --system-site-packages "$T/venv"
"$PY" -m pip --python "$T/venv/bin/python" install --no-index --no-cache-dir -q "$SRC/clients/python"
"$KVPOOLD" --quiet --rpc "ipc://$T/rpc.ipc" --admin none --events none \
	--pool name=default,blocks=16,executor=none & DPID=$!
cd "$T"
KVPOOL_LIB=$LIB "$T/venv/bin/python" - "$T" <<'PY'
import os, sys, time
import importlib.metadata as md
import kvpool, kvpool.vllm
# The wheel says what it needs from the system and which extra the examples use.
meta = md.metadata("kvpool")
assert "libkvpool.so.0.2" in (meta.get_all("Requires-External") or []), meta
assert "numpy" in (meta.get_all("Provides-Extra") or []), meta
assert kvpool.__file__.startswith(sys.argv[1] + "/venv/"), kvpool.__file__
# PEP 561: type checkers use the installed package's hints.
assert os.path.exists(os.path.join(os.path.dirname(kvpool.__file__), "py.typed"))
deadline = time.monotonic() + 10
while True:
    try:
        c = kvpool.Client(f"ipc://{sys.argv[1]}/rpc.ipc", timeout_ms=500, retries=0)
        break
    except (kvpool.Unavailable, kvpool.Busy):
        assert time.monotonic() < deadline, "kvpoold did not start"
        time.sleep(0.05)
pool = kvpool.vllm.RemoteBlockPool(c)
blocks = pool.get_new_blocks(3)
assert [b.block_id for b in blocks] == [1, 2, 3], blocks
pool.free_blocks(reversed(blocks))
assert pool.get_num_free_blocks() == 15
print("installed kvpool", kvpool.__version__, "works from", kvpool.__file__)
PY
