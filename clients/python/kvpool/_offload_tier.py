# SPDX-License-Identifier: Apache-2.0
"""What both sides of kvpool's offloading tier share (kvpool.vllm_offload):
the job's rows (KVPoolRowsSpec), a session with the pool, and the checks an
engine passes at start. Imports neither side."""
from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from vllm.logger import init_logger
from vllm.v1.kv_offload.base import LoadStoreSpec, OffloadKey
from vllm.v1.kv_offload.config import OffloadingConfig

import kvpool

logger = init_logger(__name__)


class KVPoolRowsSpec(LoadStoreSpec):
    """Rows of kvpoold's shared region, one per offloaded block, in the order
    of the job's GPU blocks; -1 (stores only): the key needs no write (it
    was stored by someone else meanwhile, or the pool had no room). epoch
    names the pool's life the rows belong to (Hello's event_epoch, new at
    each kvpoold start, whose region is a new file); None: the worker's
    current one. region: that life's region as the scheduler holds it open
    (kvpool.RegionRef), so a worker that has not mapped it yet maps it
    through the scheduler's descriptor, even with kvpoold gone."""

    def __init__(self, keys: list[OffloadKey], rows: Optional[list[int]] = None,
                 epoch: Optional[int] = None, region: Optional[kvpool.RegionRef] = None):
        self.keys = list(keys)
        self.rows = np.full(len(self.keys), -1, dtype=np.int32) if rows is None else \
            np.asarray(rows, dtype=np.int32)
        self.epoch = epoch
        self.region = region

    def __repr__(self) -> str:
        return f"KVPoolRowsSpec({self.rows.tolist()}, epoch={self.epoch})"


def _connect(extra: dict[str, Any], name: str, vllm_pod: Optional[str] = None,
             timeout_ms: int = 5000, retries: int = 2) -> kvpool.Client:
    url = extra.get("kvpool_url")
    if not url:
        raise ValueError("kvpool: kv_connector_extra_config needs kvpool_url "
                         "(kvpoold's ipc:// URL on this host)")
    token = extra.get("kvpool_token")
    tf = extra.get("kvpool_token_file")
    if token is None and tf:
        with open(tf, encoding="utf-8") as f:
            token = f.read().strip()
    return kvpool.Client(url, pool=extra.get("kvpool_pool", "default"), token=token,
                         client_name=name,
                         timeout_ms=int(extra.get("kvpool_timeout_ms", timeout_ms)),
                         retries=retries,
                         vllm_pod=vllm_pod)


def _engine_pod(extra: dict[str, Any]) -> Optional[str]:
    """The pod the tier's events are credited to: kvpool_vllm_pod, else $POD_IP
    (llm-d's {pod}, from the downward API), else none."""
    return extra.get("kvpool_vllm_pod") or os.environ.get("POD_IP") or None


def _engine_hash_algo() -> Optional[str]:
    """vLLM's --prefix-caching-hash-algo for the engine being built, where
    vLLM has its config current (None where not)."""
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:
        return None
    cfg = get_current_vllm_config_or_none()
    return getattr(getattr(cfg, "cache_config", None), "prefix_caching_hash_algo", None)


def check_hashing(info: dict, algo: Optional[str],
                  hash_seed: Optional[str] = None) -> Optional[str]:
    """Refuses (ValueError naming both settings) an engine whose block
    hashes can never be the pool's keys: another algorithm, so another key
    length, on which every lookup would fail. Returns a warning, or None,
    when they match but engines cannot share: vLLM's xxhash algorithms draw
    a random NONE_HASH in each engine unless PYTHONHASHSEED (hash_seed) is
    set, so no engine hits another's blocks."""
    pool = info["hash_algorithm"]
    if algo is not None and algo != pool:
        raise ValueError(
            f"kvpool: vLLM hashes blocks with --prefix-caching-hash-algo {algo}, pool "
            f"{info['pool']} with hash_algo={pool}: no key could ever match. Start vLLM with "
            f"--prefix-caching-hash-algo {pool}, or the pool with hash_algo={algo}")
    if (algo or pool).startswith("xxhash") and not hash_seed:
        return (f"kvpool: vLLM's {algo or pool} draws a random NONE_HASH in each engine "
                "unless PYTHONHASHSEED is set: engines on this tier will not hit each other's "
                "blocks. Set PYTHONHASHSEED to one value in every engine that shares it")
    return None


def _check_tier(c: kvpool.Client, config: OffloadingConfig, blocks_per_chunk: int,
                need: Optional[int] = None) -> None:
    """The pool must be a region whose shard can hold one worker's block
    (need bytes: the worker's own count, else the config's, 0 if unknown),
    keyed by the engine's hash algorithm."""
    info = c.info
    warning = check_hashing(info, _engine_hash_algo(), os.environ.get("PYTHONHASHSEED"))
    if warning:
        logger.warning("%s", warning)
    if not info.get("region"):
        raise ValueError(f"kvpool: pool {info['pool']} has no shared region (a cpu pool "
                         "with prefix caching, and kvpoold's --region-dir)")
    if blocks_per_chunk != 1:
        raise ValueError("kvpool: one offloaded block per GPU block only (leave the "
                         "OffloadingConnector's block_size at the GPU block size)")
    if config.canonical_layout or config.replicated_layout:
        raise ValueError("kvpool: the direct layout only (no canonical_layout or "
                         "replicated_layout)")
    ex = info["executor"] or {}
    world = max(1, config.parallel.world_size)
    if need is None:
        need = config.worker_kv_bytes_per_block
    with c.region() as reg:
        shards, shard_bytes = reg.shards, reg.shard_bytes
    if shards != world or (need and shard_bytes < need):
        raise ValueError(
            f"kvpool: pool {info['pool']} has {shards} shard(s) of {shard_bytes} bytes a row; "
            f"this engine has {world} worker(s) of {need} KV bytes a block: give the pool "
            f"shards={world} and a KV shape of at least {need * world} bytes a block "
            f"(layers x 2 x block_size x KV heads x head_size x dtype size; now "
            f"{ex.get('block_bytes')})")
