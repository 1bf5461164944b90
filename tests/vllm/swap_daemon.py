# SPDX-License-Identifier: Apache-2.0
"""One kvpoold per swapped vLLM object, for kvpool_swap.py and
kvpool_swap_manager.py: start it with one pool "p" under a scratch
folder, connect a kvpool.Client, and stop both (client first)."""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

import kvpool  # noqa: E402

_TMP = tempfile.mkdtemp(prefix="kvpool-swap-")
atexit.register(shutil.rmtree, _TMP, True)


def kvpoold():
    p = os.environ.get("KVPOOLD") or os.path.join(ROOT, "build", "service", "kvpoold")
    if not os.path.exists(p):
        raise RuntimeError(f"swap_daemon: no kvpoold at {p} (set KVPOOLD)")
    return p


def start(spec, events=False):
    """(process, client, events url or None) of a fresh kvpoold whose one
    pool is "name=p," + spec, limits raised for vLLM's tests' sizes."""
    d = tempfile.mkdtemp(dir=_TMP)
    url = f"ipc://{d}/rpc.ipc"
    ev = f"ipc://{d}/ev.ipc" if events else None
    proc = subprocess.Popen([kvpoold(), "--quiet", "--rpc", url, "--admin", "none",
                             "--events", ev or "none", "--max-ids", "1000000",
                             "--max-msg-bytes", "268435456", "--pool", "name=p," + spec],
                            stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            return proc, kvpool.Client(url, pool="p", timeout_ms=10000, retries=0), ev
        except (kvpool.Busy, kvpool.Unavailable):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"swap_daemon: kvpoold did not start with pool {spec}")
            time.sleep(0.02)


def stop(proc, client):
    """Closes the client, then stops the daemon (killed after 10 s)."""
    try:
        client.close()
    except Exception:
        pass
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
