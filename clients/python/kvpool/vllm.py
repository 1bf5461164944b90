# SPDX-License-Identifier: Apache-2.0
"""Adapters shaped like vLLM's classes, over a remote kvpoold pool.

RemoteBlockPool has vllm.v1.core.block_pool.BlockPool's methods, arguments
and return types; RemoteKVCacheManager has KVCacheManager's entry points
(vLLM 0.33's: get_computed_blocks returns (blocks, num_computed_tokens,
shared_prefix_boundary), the Scheduler records stats with
record_prefix_cache_stats; shared_prefix_boundary=False gives the pair of
earlier vLLM). Both take vLLM's own constructor arguments too (then they
connect from the environment: client_from_env), so vLLM 0.33's Scheduler
takes the manager by one assignment or by configuration
(kvpool.vllm_scheduler.KVPoolScheduler). Written from vLLM's documented
behaviour; no vLLM code is used or needed.

This module only names them: they live in kvpool.block_pool (the blocks,
RemoteBlockPool and what both adapters share) and kvpool.manager
(RemoteKVCacheManager) with kvpool.step (Step) and kvpool.coordinator
beneath it, imported one way, as vLLM's kv_cache_manager -> coordinator ->
block_pool.
"""
from .block_pool import (SPEC_KINDS, KVCacheBlock, KVCacheBlockCopy, KVCacheBlocks, KVCacheEvent,
                         PrefixCacheStats, RemoteBlockPool, client_from_env)
from .client import Client
from ._types import RequestLike
from .manager import RemoteKVCacheManager
from .step import Step

__all__ = ["KVCacheBlock", "KVCacheBlockCopy", "KVCacheBlocks", "KVCacheEvent", "PrefixCacheStats",
           "RemoteBlockPool", "RemoteKVCacheManager", "RequestLike", "SPEC_KINDS", "Step",
           "Client", "client_from_env"]
