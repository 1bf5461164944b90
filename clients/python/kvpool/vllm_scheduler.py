# SPDX-License-Identifier: Apache-2.0
"""vLLM 0.33's Scheduler with kvpool's RemoteKVCacheManager, chosen by
configuration alone:

    KVPOOL_URL=ipc:///run/kvpool/rpc.ipc KVPOOL_POOL=gpu0 \\
        vllm serve MODEL --scheduler-cls kvpool.vllm_scheduler.KVPoolScheduler

The pool must have the engine's shape (vLLM's KVCacheConfig: its block
count, and each KV cache group's kind and block size), prefix caching as
the engine's, and max_model_len at least the engine's; the constructor
names every difference. KVPOOL_TOKEN or KVPOOL_TOKEN_FILE give a pool's
token, KVPOOL_EVENTS_URL the daemon's event stream when vLLM's KV events
are on (kvpool.vllm.client_from_env). The pool decides the engine's GPU
block ids: one engine per pool. With vLLM's async scheduling, name
kvpool.vllm_scheduler.KVPoolAsyncScheduler instead (vLLM's AsyncScheduler,
likewise).

Needs vLLM installed (it subclasses vLLM's Scheduler); the rest of the
package does not."""
from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from .manager import RemoteKVCacheManager


def _use_pool(sched: Any) -> None:
    """Replaces the scheduler's KVCacheManager, before any request arrives,
    by a RemoteKVCacheManager made with the arguments vLLM gave its own."""
    mine = sched.kv_cache_manager
    remote = RemoteKVCacheManager(
        kv_cache_config=sched.kv_cache_config,
        max_model_len=None,  # the pool's may be longer; the engine's is checked below
        enable_caching=mine.enable_caching,
        log_stats=mine.log_stats,
        enable_kv_cache_events=mine.enable_kv_cache_events)
    if remote.max_model_len < mine.max_model_len:
        remote.close()
        raise ValueError(f"kvpool: the pool's max_model_len {remote.max_model_len} is below "
                         f"the engine's {mine.max_model_len}")
    sched.kv_cache_manager = remote


class KVPoolScheduler(Scheduler):
    """vLLM 0.33's Scheduler on a kvpool pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _use_pool(self)

    def shutdown(self) -> None:
        super().shutdown()
        self.kv_cache_manager.close()


class KVPoolAsyncScheduler(AsyncScheduler):
    """vLLM 0.33's AsyncScheduler on a kvpool pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _use_pool(self)

    def shutdown(self) -> None:
        super().shutdown()
        self.kv_cache_manager.close()
