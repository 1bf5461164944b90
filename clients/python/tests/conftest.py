# SPDX-License-Identifier: Apache-2.0
"""A real kvpoold on loopback for the tests: KVPOOLD names the program
(CTest passes the build's), else the build tree's, else the PATH's."""
import os
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))  # the package, from the tree

import kvpool  # noqa: E402


def _load_check_docs():
    """tests/check_docs.py (the docs' block parser) as a module, loaded from
    its path: ROOT/tests on sys.path would shadow vllm with tests/vllm/."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "check_docs", os.path.join(ROOT, "tests", "check_docs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


check_docs = _load_check_docs()


def _kvpoold():
    for p in (os.environ.get("KVPOOLD"), os.path.join(ROOT, "build", "service", "kvpoold"),
              shutil.which("kvpoold")):
        if p and os.path.exists(p):
            return p
    pytest.skip("no kvpoold (set KVPOOLD)")


def start(d, *args, pool="kv", events=False):
    """A kvpoold on ipc:// under directory d with these arguments; waits
    until pool answers. Returns (process, rpc url, events url or None)."""
    url = f"ipc://{d}/rpc.ipc"
    ev = f"ipc://{d}/events.ipc" if events else None
    proc = subprocess.Popen([_kvpoold(), "--quiet", "--rpc", url, "--admin", "none", "--events",
                             ev or "none", *args])
    deadline = time.monotonic() + 10
    while True:
        try:
            kvpool.Client(url, pool=pool, timeout_ms=500, retries=0).close()
            return proc, url, ev
        except (kvpool.Busy, kvpool.Unavailable):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("kvpoold did not start")
            time.sleep(0.05)


def stop(proc):
    proc.terminate()
    assert proc.wait(timeout=10) == 0, "kvpoold did not stop cleanly (invariants)"


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    proc, url, _ = start(tmp_path_factory.mktemp("kvpoold"),
                         "--kv-layers", "2", "--kv-heads", "2", "--kv-head-size", "16",
                         "--pool", "name=kv,blocks=64,block_size=16,seed=0",
                         "--pool", "name=bare,blocks=8,executor=none",
                         # no seed: hashes as a default vLLM 0.33 (the example's)
                         "--pool", "name=dflt,blocks=64,block_size=16",
                         "--pool", "name=gptoss,blocks=21,seed=0,executor=none,"
                                   "groups=full:16+sliding_window:16:32")
    yield url
    stop(proc)
