# SPDX-License-Identifier: Apache-2.0
"""A pytest plugin that runs vLLM's own Scheduler tests with kvpool's
RemoteKVCacheManager in the Scheduler: loaded with `-p
kvpool_swap_manager` (this folder on sys.path). Every Scheduler that
vLLM's tests make through tests/v1/core/utils.create_scheduler gets, by
one assignment as the README shows, a RemoteKVCacheManager over a pool of
the same shape on a kvpoold of its own (real process, ipc:// socket).
Schedulers the tests build another way keep vLLM's manager; the report
header says so. Schedulers with more than one KV cache group, or groups
other than full attention, are refused (KVPoolUnsupported): the adapter's
get_computed_blocks serves one full-attention group."""
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
from kvpool.vllm import RemoteKVCacheManager  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

_TMP = tempfile.mkdtemp(prefix="kvpool-swapm-")
atexit.register(shutil.rmtree, _TMP, True)
_procs = []    # (kvpoold, its client), stopped after each test: client first
_swapped = {}  # nodeid -> passed, for tests whose Scheduler got the adapter
_current = [None]


class KVPoolUnsupported(NotImplementedError):
    """A Scheduler shape the adapter does not serve."""


def _kvpoold():
    p = os.environ.get("KVPOOLD") or os.path.join(ROOT, "build", "service", "kvpoold")
    if not os.path.exists(p):
        raise RuntimeError(f"kvpool_swap_manager: no kvpoold at {p} (set KVPOOLD)")
    return p


def remote_manager_for(scheduler):
    """A RemoteKVCacheManager over a fresh kvpoold pool shaped as the
    scheduler's own manager (blocks, block size, caching, events, stats)."""
    mine = scheduler.kv_cache_manager
    cfg = mine.kv_cache_config
    groups = cfg.kv_cache_groups
    if len(groups) != 1 or type(groups[0].kv_cache_spec) is not FullAttentionSpec:
        raise KVPoolUnsupported("kvpool_swap_manager: only one full-attention group")
    bs = groups[0].kv_cache_spec.block_size
    d = tempfile.mkdtemp(dir=_TMP)
    url, ev = f"ipc://{d}/rpc.ipc", f"ipc://{d}/ev.ipc"
    spec = (f"name=p,blocks={cfg.num_blocks},block_size={bs},"
            f"caching={'on' if mine.enable_caching else 'off'},executor=none,"
            f"max_model_len={max(mine.max_model_len, 16)}")
    proc = subprocess.Popen([_kvpoold(), "--quiet", "--rpc", url, "--admin", "none", "--events",
                             ev, "--max-ids", "1000000", "--max-msg-bytes", "268435456",
                             "--pool", spec], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            client = kvpool.Client(url, pool="p", timeout_ms=10000, retries=0)
            _procs.append((proc, client))
            break
        except (kvpool.Busy, kvpool.Unavailable):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError("kvpool_swap_manager: kvpoold did not start")
            time.sleep(0.02)
    events = bool(getattr(mine, "enable_kv_cache_events", False))
    return RemoteKVCacheManager(client, events, events_url=ev if events else None,
                                log_stats=mine.log_stats)


def _install():
    from tests.v1.core import utils
    real = utils.create_scheduler

    def create_scheduler(*args, **kwargs):
        scheduler = real(*args, **kwargs)
        scheduler.kv_cache_manager = remote_manager_for(scheduler)  # the one assignment
        if _current[0] is not None:
            _swapped.setdefault(_current[0], False)
        return scheduler
    utils.create_scheduler = create_scheduler
    for name, mod in list(sys.modules.items()):
        if name.startswith("tests.") and getattr(mod, "create_scheduler", None) is real:
            mod.create_scheduler = create_scheduler


def pytest_configure(config):
    _install()


def pytest_runtest_setup(item):
    _current[0] = item.nodeid


def pytest_runtest_logreport(report):
    if report.when == "call" and report.nodeid in _swapped:
        _swapped[report.nodeid] = report.passed


def pytest_terminal_summary(terminalreporter):
    n, ok = len(_swapped), sum(_swapped.values())
    terminalreporter.write_line(f"kvpool_swap_manager: {n} tests ran vLLM's Scheduler with "
                                f"RemoteKVCacheManager; {ok} of them passed")


def pytest_runtest_teardown(item, nextitem):
    while _procs:
        p, client = _procs.pop()
        client.close()
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def pytest_report_header(config):
    return ("kvpool_swap_manager: create_scheduler's Schedulers get a RemoteKVCacheManager "
            "(a kvpoold each); Schedulers built otherwise keep vLLM's manager")
