# SPDX-License-Identifier: Apache-2.0
"""The pieces both of kvpool's vLLM adapters stand on: vLLM's block classes
(vLLM's own where vLLM 0.33 is installed), the session and events they
share (_Remote), the request mirror (_Req), the shape and key helpers, and
RemoteBlockPool, which has vllm.v1.core.block_pool.BlockPool's methods,
arguments and return types. kvpool.manager (RemoteKVCacheManager) builds on
this module, never the other way; kvpool.vllm names them both for users.
Written from vLLM's documented behaviour; no vLLM code is used or needed.

Where a network makes exactness impossible, the method says so: another
session can change a block's ref count or evict a cached block between two
calls, and events are the pool's (every session's), not this caller's.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import (Any, Iterable, Literal, NamedTuple, Optional, Sequence, Union, cast,
                    overload)

from .client import Client
from ._views import _RemoteExtraKeys, _RemoteFreeQueue, _RemoteHashMap
from .errors import NoSpace, NotSupported, WrongState
from .events import BlockStored, EventBatch, Subscriber
from ._types import RequestLike  # noqa: F401 (public here: what the adapters read)
from .events import AllBlocksCleared, BlockRemoved

#: What take_events() returns: vLLM's own KVCacheEvent classes where vLLM is installed,
#: else kvpool's dataclasses of the same fields.
KVCacheEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class KVCacheBlock:
    """vLLM's KVCacheBlock as this adapter last saw it: block_id, ref_cnt
    (as the daemon reported it, then this caller's own touch/free applied),
    block_hash (hash || 4-byte group id, or None) and is_null. One object
    per block id per adapter, as vLLM's pool hands out the same objects."""
    __slots__ = ("block_id", "ref_cnt", "_block_hash", "is_null")

    def __init__(self, block_id: int, ref_cnt: int = 0, is_null: bool = False) -> None:
        self.block_id = block_id
        self.ref_cnt = ref_cnt
        self._block_hash: Optional[bytes] = None
        self.is_null = is_null

    @property
    def block_hash(self) -> Optional[bytes]:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, h: bytes) -> None:
        assert self._block_hash is None, "The block already has a hash."
        self._block_hash = h

    def reset_hash(self) -> None:
        self._block_hash = None

    def __repr__(self) -> str:
        return (f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
                f"block_hash={self._block_hash!r}, is_null={self.is_null})")


@dataclass
class PrefixCacheStats:
    """vLLM's PrefixCacheStats (vllm.v1.metrics.stats): what
    RemoteKVCacheManager(log_stats=True).make_prefix_cache_stats() returns.
    Per get_computed_blocks that looked the cache up: requests, queries (the
    request's tokens) and hits (hit tokens), or the preempted_* three for a
    request whose num_preemptions is above 0; reset: reset_prefix_cache
    succeeded since the last make_prefix_cache_stats."""
    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


_CLASSES: Optional[tuple[type, type, type]] = None


def _classes() -> tuple[type, type, type]:
    """The classes the adapters hand out: (block, KVCacheBlocks,
    PrefixCacheStats). vLLM 0.33's own where it is installed (so
    isinstance() against them holds; the block is a subclass of vLLM's
    KVCacheBlock that also keeps this adapter's per-manager count), this
    module's otherwise. Resolved on first use: importing kvpool never
    imports vLLM."""
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = (KVCacheBlock, KVCacheBlocks, PrefixCacheStats)
        try:
            import vllm
            if vllm.__version__.startswith("0.33."):
                from vllm.v1.core.kv_cache_manager import KVCacheBlocks as Blocks
                from vllm.v1.core.kv_cache_utils import KVCacheBlock as Block
                from vllm.v1.metrics.stats import PrefixCacheStats as Stats

                class RemoteKVCacheBlock(Block):  # type: ignore[valid-type,misc]
                    """vLLM's KVCacheBlock, as a remote adapter last saw it."""
                    __slots__ = ()

                _CLASSES = (RemoteKVCacheBlock, Blocks, Stats)
        except ImportError:
            pass
    return _CLASSES


class KVCacheBlockCopy(NamedTuple):
    """A copy-on-write job (vLLM 0.33's KVCacheBlockCopy where vLLM is absent)."""
    src_block_id: int
    dst_block_id: int


def _block_copy_cls() -> type:
    """vLLM 0.33's KVCacheBlockCopy where it is installed, this module's otherwise."""
    try:
        import vllm
        if vllm.__version__.startswith("0.33."):
            from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy as Copy
            return Copy  # type: ignore[no-any-return]
    except ImportError:
        pass
    return KVCacheBlockCopy


def _group_key(h, gid):
    return h + gid.to_bytes(4, "big")


def _concat_keys(info) -> bool:
    """Whether the pool keys a coarse block by its k fine hashes joined
    (vllm=9aaf83ef5) rather than by its last fine hash (vLLM 0.33, the
    default). Only a 9aaf83ef5 pool with coarse groups caches keys longer than
    one digest; for one hash block a block the two rules agree."""
    return info["max_hash_len"] > info["hash_len"]


def _coarse_hash(fine, i, k, concat):
    """Coarse block i's key hash over fine hashes, k to a block (the
    pool's rule, engine/pool.h kvp_pool_coarse_hash)."""
    if k == 1:
        return fine[i]
    return b"".join(fine[i * k:(i + 1) * k]) if concat else fine[(i + 1) * k - 1]


def _request_keys(request):
    """LoRA name, path and id, cache salt, multimodal features and session
    id (events only) of a vLLM Request."""
    lora = getattr(request, "lora_request", None)
    mm = []
    for f in getattr(request, "mm_features", None) or ():
        pos = f.mm_position
        mm.append((f.identifier, pos.offset, pos.length))
    return {"lora_name": getattr(lora, "lora_name", None) if lora else None,
            "lora_path": getattr(lora, "lora_path", None) if lora else None,
            "lora_id": (getattr(lora, "adapter_id", None) or getattr(lora, "lora_int_id", None))
            if lora else None,
            "cache_salt": getattr(request, "cache_salt", None), "mm": mm or None,
            "session_id": getattr(request, "session_id", None)}


def _vllm_event_classes() -> Optional[dict[type, Any]]:
    """vLLM's own event classes by kvpool's, when vLLM is installed."""
    global _VLLM_EVENTS
    if _VLLM_EVENTS is None:
        try:
            from vllm.distributed import kv_events as vke
        except ImportError:
            _VLLM_EVENTS = {}
        else:
            _VLLM_EVENTS = {BlockStored: vke.BlockStored, BlockRemoved: vke.BlockRemoved,
                            AllBlocksCleared: vke.AllBlocksCleared}
    return _VLLM_EVENTS or None


_VLLM_EVENTS: Optional[dict[type, Any]] = None


def _as_vllms(events: list) -> list:
    """The events as vLLM's own classes (vllm.distributed.kv_events, so
    isinstance() against them holds), field for field, where vLLM is
    installed; kvpool's dataclasses of the same fields otherwise."""
    classes = _vllm_event_classes()
    if classes is None:
        return events
    return [classes[type(e)](**{f: getattr(e, f) for f in e.__dataclass_fields__})
            for e in events]


def client_from_env() -> Client:
    """The Client the adapters open when vLLM constructs them with its own
    arguments: KVPOOL_URL (required), KVPOOL_POOL (default: the daemon's
    first pool), and KVPOOL_TOKEN or KVPOOL_TOKEN_FILE on a pool with a
    token. Their events come from KVPOOL_EVENTS_URL."""
    url = os.environ.get("KVPOOL_URL")
    if not url:
        raise ValueError("kvpool: vLLM made this adapter with its own arguments; set KVPOOL_URL "
                         "(and KVPOOL_POOL, KVPOOL_TOKEN or KVPOOL_TOKEN_FILE) or pass a "
                         "kvpool.Client")
    return Client(url, pool=os.environ.get("KVPOOL_POOL") or None, token=_env_token())


def _env_token() -> Optional[str]:
    token = os.environ.get("KVPOOL_TOKEN")
    path = os.environ.get("KVPOOL_TOKEN_FILE")
    if token is None and path:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    return token


#: vLLM's KVCacheSpec class names by the group kinds a pool reports (its Hello).
SPEC_KINDS = {"FullAttentionSpec": "full_attention", "SlidingWindowSpec": "sliding_window",
              "ChunkedLocalAttentionSpec": "chunked_local_attention", "MambaSpec": "mamba",
              "CrossAttentionSpec": "cross_attention"}


def _spec_kind(spec) -> str:
    """kvpool's group kind for a vLLM KVCacheSpec (by class name: no vLLM import)."""
    return SPEC_KINDS.get(type(spec).__name__, type(spec).__name__)


def _spec_shape(spec) -> tuple:
    """What a pool's group must match of a vLLM KVCacheSpec: its kind, block
    size, and window (sliding window) or chunk (chunked local attention)."""
    kind = _spec_kind(spec)
    param = {"sliding_window": getattr(spec, "sliding_window", None),
             "chunked_local_attention": getattr(spec, "attention_chunk_size", None)}.get(kind)
    return (kind, spec.block_size) if param is None else (kind, spec.block_size, param)


def _group_shape(group: dict) -> tuple:
    """_spec_shape of a pool's group (Client.info["groups"])."""
    param = group.get("sliding_window", group.get("attention_chunk_size"))
    shape = (group["kind"], group["block_size"])
    return shape if param is None else shape + (param,)


def _check_shape(info: dict, **asked: Any) -> None:
    """ValueError naming every argument vLLM gave that the pool does not
    match (None: not given). kv_cache_config is compared by its block count
    and each group's kind and block size."""
    have = {"num_gpu_blocks": info["num_blocks"], "enable_caching": info["prefix_caching"],
            "hash_block_size": info["hash_block_size"], "max_model_len": info["max_model_len"]}
    bad = [f"{k}={v!r} (the pool: {have[k]!r})" for k, v in asked.items()
           if k in have and v is not None and v != have[k]]
    cfg = asked.get("kv_cache_config")
    if cfg is not None:
        groups = info["groups"] or [{"kind": "full_attention", "block_size": info["block_size"]}]
        want = [_spec_shape(g.kv_cache_spec) for g in cfg.kv_cache_groups]
        got = [_group_shape(g) for g in groups]
        if cfg.num_blocks != info["num_blocks"]:
            bad.append(f"kv_cache_config.num_blocks={cfg.num_blocks} "
                       f"(the pool: {info['num_blocks']})")
        if want != got:
            bad.append(f"kv_cache_config groups {want} (the pool: {got})")
    if bad:
        raise ValueError(f"kvpool: pool {info['pool']!r} does not have the shape vLLM asked "
                         f"for: {', '.join(bad)}")


class _Remote:
    """What both adapters share: the client, block objects, events."""

    def __init__(self, client, enable_kv_cache_events, events_url, token, annotate):
        if isinstance(client, str):
            raise TypeError("kvpool: pass a kvpool.Client (it names the pool and token)")
        self._own_client = client is None  # opened here: closed by close()
        if client is None:
            client = client_from_env()
            events_url = events_url or os.environ.get("KVPOOL_EVENTS_URL")
            token = token if token is not None else _env_token()
        self.client = client
        info = client.info
        self.num_gpu_blocks = info["num_blocks"]
        self.enable_caching = info["prefix_caching"]
        self.hash_block_size = info["hash_block_size"]
        self.enable_kv_cache_events = enable_kv_cache_events
        self._block_cls, self._blocks_cls, self._stats_cls = _classes()
        self.null_block = self._block_cls(0, is_null=True)
        self._blocks = {0: self.null_block}
        self._annotate = annotate
        self._sub = None
        self._queue: list = []  # events read, not yet taken (kv_event_queue)
        self._events_owner = self  # whose stream and queue (a manager's block_pool: the manager's)
        self.metrics_collector = None  # vLLM's residency metrics: the daemon's /metrics instead
        if enable_kv_cache_events:
            if not events_url:
                self.close()
                raise ValueError("kvpool: enable_kv_cache_events needs the daemon's events_url "
                                 "(KVPOOL_EVENTS_URL when vLLM constructs the adapter)")
            self._sub = Subscriber(events_url, client.url, pools=[info["pool"]], token=token,
                                   index=False)

    def _block(self, block_id):
        b = self._blocks.get(block_id)
        if b is None:
            b = self._blocks[block_id] = self._block_cls(block_id)
        return b

    def _take_events(self, timeout_s=5.0):
        """Every event the pool emitted up to now, in order. Waits until the
        subscriber has delivered the batches below the stream position the
        daemon reports (so this caller's own calls' events are all there)."""
        if self._sub is None:
            return []
        epoch, target = self.client.event_position()
        out, wait_ms = [], 0
        deadline = time.monotonic() + timeout_s
        while True:
            for item in self._sub.poll(wait_ms):
                if isinstance(item, EventBatch):
                    out.extend(item.events)
            st = self._sub.stats()
            if st["epoch"] == epoch and st["next_seq"] >= target:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("kvpool: the event stream did not catch up in time")
            wait_ms = 10
        if not self._annotate:  # BlockPool's own events carry no spec annotation
            out = [replace(e, kv_cache_spec_kind=None, kv_cache_spec_sliding_window=None)
                   if isinstance(e, BlockStored) else e for e in out]
        return _as_vllms(out)

    @property
    def kv_event_queue(self) -> list:
        """vLLM's pending-event list: the events the daemon has published
        for this pool up to now that take_events() has not returned (read
        from the stream first, so one round trip); what a caller appends is
        returned by the next take_events(), after them."""
        owner = self._events_owner
        owner._queue.extend(owner._take_events())
        return owner._queue

    def _take_queued(self) -> list:
        owner = self._events_owner
        out, owner._queue = owner._queue, []
        out.extend(owner._take_events())
        return out

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drops the listed blocks' hashes (ref counts and queue unchanged):
        BlockPool's, and KVCacheManager's, which vLLM's scheduler calls for the
        blocks a KV connector failed to load."""
        ids = list(dict.fromkeys(block_ids))  # vLLM's order: the set's, duplicates once
        for i in ids:
            assert 0 <= i < self.num_gpu_blocks, (
                f"Invalid block_id {i} >= {self.num_gpu_blocks}. This indicates a bug in the KV "
                "connector - workers should only report block IDs that were allocated by the "
                "scheduler.")
        if ids:
            self.client.evict(ids)
        for i in ids:
            if i in self._blocks:
                self._blocks[i].reset_hash()

    def reset_prefix_cache(self) -> bool:
        """True and every hash dropped, or False (blocks still in use)."""
        try:
            self.client.reset()
        except WrongState:
            return False
        for b in self._blocks.values():
            b.reset_hash()
        return True

    def close(self) -> None:
        """Closes the event subscriber, and the client when the adapter opened it."""
        if self._sub is not None:
            self._sub.close()
            self._sub = None
        if self._own_client:
            self._own_client = False
            self.client.close()


class RemoteBlockPool(_Remote):
    """vLLM's BlockPool over a remote pool (one Client session).

    enable_kv_cache_events: take_events() returns the pool's events, read
    from the daemon's event stream at events_url (every session's events,
    in the pool's order). Ref counts are the daemon's at the time of the
    call that returned the block; another session may change them after."""

    def __init__(self, client: Optional[Client] = None, enable_kv_cache_events: bool = False, *,
                 events_url: Optional[str] = None, token: Optional[str] = None,
                 num_gpu_blocks: Optional[int] = None, enable_caching: Optional[bool] = None,
                 hash_block_size: Optional[int] = None, metrics_collector: Any = None,
                 num_hash_lookahead_tokens: int = 0, medium: Optional[str] = None) -> None:
        """client: a kvpool.Client, or None to connect from the environment
        (client_from_env), as when vLLM constructs BlockPool with its own
        keywords (num_gpu_blocks, enable_caching, hash_block_size, ...):
        those are checked against the pool (ValueError names each that
        differs), since the pool's size and settings are the daemon's.
        metrics_collector is not fed (the daemon's /metrics has residency);
        lookahead hashing (num_hash_lookahead_tokens > 0) is NotSupported."""
        if num_hash_lookahead_tokens:
            raise NotSupported(NotSupported.status, "NOT_SUPPORTED",
                               "num_hash_lookahead_tokens: kvpool pools hash no lookahead tokens")
        super().__init__(client, enable_kv_cache_events, events_url, token, annotate=False)
        try:
            _check_shape(self.client.info, num_gpu_blocks=num_gpu_blocks,
                         enable_caching=enable_caching, hash_block_size=hash_block_size)
            if medium is not None and medium != self.client.info["medium"]:
                raise ValueError(f"kvpool: pool {self.client.info['pool']!r} publishes medium "
                                 f"{self.client.info['medium']!r}, not {medium!r}")
        except ValueError:
            self.close()
            raise
        # vLLM 0.33's Mamba manager reads it: a kvpool pool hashes no lookahead tokens.
        self.num_hash_lookahead_tokens = 0
        self.medium = self.client.info["medium"]  # what the pool's events say

    def is_block_writable(self, block: KVCacheBlock) -> bool:
        """vLLM 0.33's: whether block can be mutated by its sole owner (not
        the null block, one reference, no hash), from the block as this
        adapter last saw it: another session may touch it after."""
        return not block.is_null and block.ref_cnt == 1 and block.block_hash is None

    def unpin_blocks(self, blocks: Iterable[KVCacheBlock], on_reuse: Any) -> None:
        """vLLM 0.33's hisparse release (a block stays readable until
        reused, on_reuse called then) cannot work on a shared pool: another
        process reuses the block, and no call back reaches this one."""
        raise NotSupported(NotSupported.status, "NOT_SUPPORTED",
                           "unpin_blocks: a block another session reuses cannot call back "
                           "into this process; free_blocks releases blocks")

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """num_blocks blocks from the free queue's head; ValueError (nothing
        changed) when fewer are free, as vLLM."""
        if num_blocks == 0:
            return []
        try:
            ids = self.client.allocate(num_blocks)
        except NoSpace:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool") from None
        out = []
        for i in ids:
            b = self._block(i)
            b.ref_cnt = 1
            b.reset_hash()  # evicted on reuse
            out.append(b)
        return out

    def touch(self, blocks: Union[Sequence[KVCacheBlock],
                                  Sequence[Sequence[KVCacheBlock]]]) -> None:
        """Takes a reference on each block (a sequence of blocks, or vLLM's
        older tuple of per-group sequences)."""
        flat: list[KVCacheBlock] = []
        for item in blocks:
            if hasattr(item, "block_id"):  # a block: vLLM's class or this module's
                flat.append(cast(KVCacheBlock, item))
            else:
                flat.extend(item)
        ids = [b.block_id for b in flat if not b.is_null]
        if ids:
            self.client.touch(ids)
        for b in flat:
            b.ref_cnt += 1  # the null block's drifts, as vLLM's

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drops a reference on each block; the first freed is evicted first."""
        blocks = list(ordered_blocks)
        ids = [b.block_id for b in blocks if not b.is_null]
        if ids:
            self.client.free(ids)
        for b in blocks:
            b.ref_cnt -= 1

    def cache_full_blocks(self, request: RequestLike, blocks: Sequence[KVCacheBlock],
                          num_cached_blocks: int, num_full_blocks: int, block_size: int,
                          kv_cache_group_id: int,
                          block_mask: Optional[Sequence[bool]] = None) -> None:
        """Caches blocks [num_cached_blocks, num_full_blocks) of the request
        under its hashes (request.block_hashes, fine, of hash_block_size
        tokens); the daemon emits the BlockStored event."""
        if num_cached_blocks >= num_full_blocks:
            return
        k = block_size // self.hash_block_size
        fine = list(request.block_hashes[:num_full_blocks * k])
        keys = _request_keys(request)
        self.client.cache_hashes([b.block_id for b in blocks[:num_full_blocks]], fine,
                                 num_cached_blocks, num_full_blocks, block_size=block_size,
                                 group_id=kv_cache_group_id, tokens=request.all_token_ids,
                                 block_mask=block_mask, **keys)
        for i in range(num_cached_blocks, num_full_blocks):
            b = blocks[i]
            if b.is_null or (block_mask is not None and not block_mask[i - num_cached_blocks]):
                continue
            b._block_hash = _group_key(_coarse_hash(fine, i, k, _concat_keys(self.client.info)),
                                       kv_cache_group_id)

    def cache_partial_block(self, request: RequestLike, block: KVCacheBlock, num_tokens: int,
                            kv_cache_group_id: int, block_size: int,
                            replace_existing_hashes: bool = False) -> Optional[bytes]:
        """vLLM 0.33's partial entry: makes block reachable from the prefix
        boundary at num_tokens (a multiple of hash_block_size); the daemon
        emits the BlockStored event. Returns the entry's key (hash || group),
        or None for the null block. Differs from vLLM: the session must hold
        the block, and a pool holds at most as many extra keys as blocks
        (kvpool.NoSpace past that)."""
        if block.is_null:
            return None
        nh = num_tokens // self.hash_block_size
        if num_tokens <= 0 or num_tokens % self.hash_block_size or nh > len(request.block_hashes):
            raise ValueError(f"kvpool: num_tokens {num_tokens} must be a positive multiple of "
                             f"{self.hash_block_size} within the request's hashes")
        fine = list(request.block_hashes[:nh])
        self.client.cache_partial(block.block_id, num_tokens, fine, block_size=block_size,
                                  group_id=kv_cache_group_id, tokens=request.all_token_ids,
                                  replace_existing=replace_existing_hashes,
                                  **_request_keys(request))
        key = _group_key(fine[-1], kv_cache_group_id)
        if block.block_hash is None or replace_existing_hashes:
            block._block_hash = key
        return key

    def emit_cached_block_events(self, request: RequestLike, num_cached_blocks: int,
                                 block_size: int, kv_cache_group_id: int) -> None:
        """vLLM 0.33's reuse report (kv_cache_report_mode "full"): with
        events on, the pool publishes one BlockStored for the request's first
        num_cached_blocks blocks, its prefix-cache hits, on every event wire
        (so routers see it too), and take_events() returns it in order.
        Every hash is named, as vLLM names them, whether still cached or not."""
        if not self.enable_kv_cache_events or num_cached_blocks == 0:
            return
        k = block_size // self.hash_block_size
        self.client.report_cached(list(request.block_hashes[:num_cached_blocks * k]),
                                  num_cached_blocks, block_size=block_size,
                                  group_id=kv_cache_group_id, tokens=request.all_token_ids,
                                  **_request_keys(request))

    def move_block_hashes(self, src_block: KVCacheBlock, dst_block: KVCacheBlock) -> None:
        """vLLM 0.33's move_block_hashes: src_block's keys now name dst_block
        (which has none), with no events; this session holds both."""
        self.client.move_hashes(src_block.block_id, dst_block.block_id)
        dst_block._block_hash, src_block._block_hash = src_block.block_hash, None

    def get_cached_block(self, block_hash: bytes,
                         kv_cache_group_ids: Sequence[int]) -> Optional[list[KVCacheBlock]]:
        """One cached block per group for this hash, or None if any group
        misses. Pure (no reference taken): the block may be evicted by
        another session before this caller touches it. block_hash is one
        digest (vLLM 0.33: a coarse block's is its last fine hash), or on a
        vllm=9aaf83ef5 pool the k fine hashes of a coarse block joined."""
        hl = self.client.info["hash_len"]
        if not block_hash or len(block_hash) % hl:
            raise ValueError(f"kvpool: a block hash is {hl} bytes per hash block")
        k = len(block_hash) // hl  # 1 for every key of a vLLM 0.33 pool
        fine = [block_hash[i * hl:(i + 1) * hl] for i in range(k)]
        ids, refs = self.client.lookup_hashes(fine, group_ids=list(kv_cache_group_ids),
                                              block_size=k * self.hash_block_size)
        if not ids or not ids[0]:
            return None
        out = []
        for g, gid in enumerate(kv_cache_group_ids):
            b = self._block(ids[g][0])
            b.ref_cnt = refs[g][0]
            b._block_hash = _group_key(block_hash, gid)
            out.append(b)
        return out

    def get_num_free_blocks(self) -> int:
        return self.client.stats()["num_free"]

    metrics_collector = None  # vLLM's residency metrics: the daemon keeps its own (/metrics)

    @property
    def blocks(self) -> list[KVCacheBlock]:
        """vLLM's block list, id order: this adapter's blocks (one object per
        id, shared with the manager on its session), ref counts as this
        session last saw them; another session's references are not there."""
        return [self._block(i) for i in range(self.num_gpu_blocks)]

    @property
    def free_block_queue(self) -> _RemoteFreeQueue:
        """vLLM's free queue as callers read it: num_free_blocks, the daemon's
        count now, and get_all_free_blocks(), its order read from the daemon
        (a view for tests and debugging). Its links stay in the daemon."""
        return _RemoteFreeQueue(self)

    @property
    def cached_block_hashes_by_block(self) -> _RemoteExtraKeys:
        """vLLM 0.33's: each block's partial prefix-cache entries (keys beyond
        its primary one), block id -> set of keys; a read-only view."""
        return _RemoteExtraKeys(self)

    @property
    def cached_block_hash_to_block(self) -> _RemoteHashMap:
        """vLLM's prefix-cache map as callers read it: len() (the daemon's
        key count) and get_one_block(key), a Lookup. Insert and pop are the
        pool's calls (cache_full_blocks, evict_blocks), not the map's."""
        return _RemoteHashMap(self)

    def get_usage(self) -> float:
        return self.client.stats()["usage"]

    def take_events(self) -> list[KVCacheEvent]:
        """The pool's events since the last call (see the class docstring)."""
        return self._take_queued()


@dataclass
class KVCacheBlocks:
    """vLLM's KVCacheBlocks: blocks[g] is group g's list of blocks."""
    blocks: tuple[Sequence[KVCacheBlock], ...]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(list(a) + list(b) for a, b in zip(self.blocks, other.blocks)))

    @overload
    def get_block_ids(self, allow_none: Literal[False] = False) -> tuple[list[int], ...]: ...

    @overload
    def get_block_ids(self, allow_none: Literal[True]) -> Optional[tuple[list[int], ...]]: ...

    def get_block_ids(self, allow_none: bool = False) -> Optional[tuple[list[int], ...]]:
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        return tuple([b.block_id for b in g] for g in self.blocks)

    def get_unhashed_block_ids(self) -> list[int]:
        assert len(self.blocks) == 1, "Only one group is supported"
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(() for _ in self.blocks))


class _Req:
    __slots__ = ("wire_id", "sent", "blocks", "computed", "cached", "last_state", "allocated")

    def __init__(self, wire_id, ngroups):
        self.wire_id = wire_id
        self.sent = 0          # tokens the daemon has
        self.computed = 0      # tokens computed, as the daemon reported
        self.reset(ngroups)

    def reset(self, ngroups):
        """No blocks: as new, or after a preemption."""
        self.blocks = [[] for _ in range(ngroups)]
        self.cached = 0  # tokens the daemon cached for it (full blocks), full attention
        # Mamba align, per group: the previous state block's index, and
        # whether blocks were ever allocated (vLLM's last_state_block_idx
        # and _allocated_block_reqs).
        self.last_state = [None] * ngroups
        self.allocated = [False] * ngroups

