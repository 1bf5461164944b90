# SPDX-License-Identifier: Apache-2.0
"""A pytest plugin that runs vLLM's own Scheduler tests with kvpool's
RemoteKVCacheManager in the Scheduler: loaded with `-p
kvpool_swap_manager` (this folder on sys.path). Every Scheduler that
vLLM's tests make through tests/v1/core/utils.create_scheduler gets, by
one assignment as docs/python.md shows, a RemoteKVCacheManager over a pool of
the same shape on a kvpoold of its own (real process, ipc:// socket).
Schedulers the tests build another way keep vLLM's manager; the report
header says so. Schedulers with a group the swap does not shape (Mamba,
MLA, sinks) are refused (KVPoolUnsupported): it makes full-attention,
sliding-window, chunked-local and cross-attention groups."""
import sys

import swap_daemon  # puts clients/python on sys.path
from kvpool.vllm import RemoteKVCacheManager
from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, CrossAttentionSpec,
                                        FullAttentionSpec, SlidingWindowSpec)

_procs = []    # (kvpoold, its client), stopped after each test: client first
_swapped = {}  # nodeid -> passed, for tests whose Scheduler got the adapter
_current = [None]


class KVPoolUnsupported(NotImplementedError):
    """A Scheduler shape the adapter does not serve."""


def remote_manager_for(scheduler):
    """A RemoteKVCacheManager over a fresh kvpoold pool shaped as the
    scheduler's own manager (blocks, block size, caching, events, stats)."""
    mine = scheduler.kv_cache_manager
    cfg = mine.kv_cache_config
    groups = [_group(g.kv_cache_spec) for g in cfg.kv_cache_groups]
    bs = cfg.kv_cache_groups[0].kv_cache_spec.block_size
    shape = f"block_size={bs}" if groups == [f"full:{bs}"] else f"groups={'+'.join(groups)}"
    events = bool(getattr(mine, "enable_kv_cache_events", False))
    proc, client, ev = swap_daemon.start(
        f"blocks={cfg.num_blocks},{shape},"
        f"caching={'on' if mine.enable_caching else 'off'},executor=none,"
        f"max_model_len={max(mine.max_model_len, 16)}", events=events)
    _procs.append((proc, client))
    return RemoteKVCacheManager(client, events, events_url=ev if events else None,
                                log_stats=mine.log_stats)


def _group(spec):
    """A pool's group for a vLLM KVCacheSpec (kvpoold's groups= syntax);
    KVPoolUnsupported for kinds the pool has no group for (MLA, sinks,
    ...) or that the swap does not shape (Mamba)."""
    bs = spec.block_size
    if type(spec) is FullAttentionSpec and spec.sliding_window is None \
            and spec.attention_chunk_size is None:
        return f"full:{bs}"
    if type(spec) is SlidingWindowSpec:
        return f"sliding_window:{bs}:{spec.sliding_window}"
    if type(spec) is ChunkedLocalAttentionSpec:
        return f"chunked_local:{bs}:{spec.attention_chunk_size}"
    if type(spec) is CrossAttentionSpec:
        return f"cross_attention:{bs}"
    return _unsupported(spec)


def _unsupported(spec):
    raise KVPoolUnsupported(f"kvpool_swap_manager: no pool group for {type(spec).__name__}")


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
        swap_daemon.stop(*_procs.pop())


def pytest_report_header(config):
    return ("kvpool_swap_manager: create_scheduler's Schedulers get a RemoteKVCacheManager "
            "(a kvpoold each); Schedulers built otherwise keep vLLM's manager")
