# SPDX-License-Identifier: Apache-2.0
"""RemoteKVCacheManager: vLLM's KVCacheManager entry points over the
daemon's request-level calls (AllocateSlots, FreeRequest, Lookup), one
round trip per call, or one Batch per scheduler step (Step)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional

from .errors import NoSpace, NotSupported
from ._types import RequestLike
from .coordinator import RemoteCoordinator, _skipped_blocks, drop_skipped, note_state
from .step import Step, _released
from .block_pool import (KVCacheBlock, KVCacheBlocks, KVCacheEvent, PrefixCacheStats,
                         RemoteBlockPool, _Remote, _Req, _block_copy_cls, _check_shape,
                         _coarse_hash, _concat_keys, _request_keys)

_GROUP0 = (0).to_bytes(4, "big")  # a block hash's group id suffix, group 0

if TYPE_CHECKING:
    from .batch import Batch
    from .client import Client


class RemoteKVCacheManager(_Remote):
    """vLLM's KVCacheManager over a remote pool (one Client session).

    A vLLM Request (or any object with request_id, all_token_ids,
    num_tokens, block_hashes and optionally lora_request, cache_salt,
    mm_features, skip_reading_prefix_cache, num_preemptions) is registered with the daemon at
    its first allocate_slots; later calls send only the tokens appended
    since. The daemon hashes tokens itself, with the pool's algorithm and
    seed: request.block_hashes must come from the same (kvpool.Hasher with
    the pool's seed) for get_computed_blocks to find what the daemon cached.

    Not exact over a network: the prefix hit that get_computed_blocks
    reports can be evicted by another session before allocate_slots takes
    it; allocate_slots then undoes its call and returns None (as vLLM does
    when a request does not fit), and the scheduler retries it next step.
    num_encoder_tokens sizes a cross-attention group (an encoder-decoder
    model's, on a pool with caching off), once, as vLLM's;
    full_sequence_must_fit is vLLM's admission gate, checked in the daemon.
    External (connector) tokens get their blocks in the daemon as vLLM's
    allocate_new_computed_blocks gives them: they join the request's table
    (get_block_ids) and are not in allocate_slots' return value, as in vLLM;
    a pool with a Mamba align group refuses them (NotSupported).
    On a hybrid pool (or one whose group is not full attention)
    get_computed_blocks asks the daemon for vLLM's coordinator hit over the
    request's hashes (Client.find_hit), the fixed point every group agrees
    on, as vLLM's HybridKVCacheCoordinator finds it."""

    def __init__(self, client: Optional[Client] = None, enable_kv_cache_events: bool = False, *,
                 events_url: Optional[str] = None, token: Optional[str] = None,
                 shared_prefix_boundary: bool = True, log_stats: bool = False,
                 kv_cache_config: Any = None, max_model_len: Optional[int] = None,
                 scheduler_block_size: Optional[int] = None,
                 hash_block_size: Optional[int] = None,
                 max_in_flight_tokens: Optional[int] = None,
                 enable_caching: Optional[bool] = None, use_eagle: bool = False,
                 num_hash_lookahead_tokens: int = 0, num_prefill_lookahead: int = 0,
                 dcp_world_size: int = 1, pcp_world_size: int = 1, metrics_collector: Any = None,
                 watermark: float = 0.0,
                 enable_mamba_shared_prefix_checkpoint: bool = False) -> None:
        """client: a kvpool.Client, or None to connect from the environment
        (kvpool.vllm.client_from_env), as when vLLM 0.33's Scheduler
        constructs KVCacheManager with its own keywords (kv_cache_config,
        max_model_len, scheduler_block_size, hash_block_size, enable_caching,
        log_stats, enable_kv_cache_events, ...): the pool must have that
        shape (ValueError names each difference), since its size, groups
        and caching are the daemon's. Accepted and not applied:
        max_in_flight_tokens (vLLM reserves with it only in sliding-window
        and chunked-local groups; the daemon keeps its own rules there) and
        metrics_collector (residency metrics are the daemon's /metrics).
        NotSupported: use_eagle, hash or prefill lookahead tokens, decode or
        prefill context parallelism, a watermark, Mamba shared-prefix
        checkpoints (vLLM features the daemon's manager does not model).

        shared_prefix_boundary=True (the default, vLLM 0.33's shape):
        get_computed_blocks returns the triple (blocks, hit tokens,
        shared_prefix_boundary), and the caller records the hit with
        record_prefix_cache_stats, as vLLM 0.33's Scheduler does. The
        boundary is that of a sparse-retention group (Mamba, sliding window)
        lagging full attention; get_computed_blocks serves single
        full-attention pools only, where vLLM's is always 0, so it is 0 here.
        shared_prefix_boundary=False: the pair of vLLM before the triple, and
        get_computed_blocks records the stats itself, as vLLM did then.
        log_stats: as vLLM's, keep PrefixCacheStats for
        make_prefix_cache_stats()."""
        off = [name for name, on in (
            ("use_eagle", use_eagle), ("num_hash_lookahead_tokens", num_hash_lookahead_tokens),
            ("num_prefill_lookahead", num_prefill_lookahead),
            ("dcp_world_size", dcp_world_size != 1), ("pcp_world_size", pcp_world_size != 1),
            ("watermark", watermark),
            ("enable_mamba_shared_prefix_checkpoint", enable_mamba_shared_prefix_checkpoint))
            if on]
        if off:
            raise NotSupported(NotSupported.status, "NOT_SUPPORTED",
                               f"RemoteKVCacheManager does not model vLLM's {', '.join(off)}")
        super().__init__(client, enable_kv_cache_events, events_url, token, annotate=True)
        try:
            _check_shape(self.client.info, kv_cache_config=kv_cache_config,
                         max_model_len=max_model_len, enable_caching=enable_caching,
                         hash_block_size=hash_block_size)
            bs = self.client.info["block_size"]
            if scheduler_block_size is not None and kv_cache_config is None and \
                    scheduler_block_size != bs:
                raise ValueError(f"kvpool: pool {self.client.info['pool']!r} has blocks of {bs} "
                                 f"tokens, not scheduler_block_size={scheduler_block_size}")
        except ValueError:
            self.close()
            raise
        self._triple = shared_prefix_boundary
        self.log_stats = log_stats
        self.prefix_cache_stats = self._stats_cls() if log_stats else None
        info = self.client.info
        self.max_model_len = info["max_model_len"]
        self.groups = info["groups"] or [{"kind": "full_attention",
                                          "block_size": info["block_size"]}]
        self.num_kv_cache_groups = len(self.groups)
        self.empty_kv_cache_blocks = self._blocks_cls(tuple(() for _ in self.groups))
        # Only full attention: no null replacement for the mirror to apply.
        self._plain = all(g["kind"] == "full_attention" for g in self.groups)
        self._reqs: dict[Any, _Req] = {}
        self._next_id = 1
        self._spare: Optional[Batch] = None  # a Batch, cleared, for the next Step or prefetch
        # request_id -> (fine hashes, ids, ref counts)
        self._prefetched: dict[Any, tuple[list[bytes], list[int], list[int]]] = {}
        self._pool: Optional[RemoteBlockPool] = None  # block_pool, made on first use
        self._coord: Optional[RemoteCoordinator] = None

    # ---- vLLM's entry points ----
    @property
    def block_pool(self) -> RemoteBlockPool:
        """A RemoteBlockPool on this manager's session and blocks: what vLLM
        0.33's Scheduler calls directly (free_blocks of blocks it popped with
        pop_blocks_for_free, get_num_free_blocks). vLLM's private structures
        (blocks, free_block_queue, the hash map) are not there."""
        if self._pool is None:
            pool = RemoteBlockPool(self.client)
            pool._blocks, pool.null_block = self._blocks, self.null_block
            # Its events are this manager's (take_events here); it only reports.
            pool.enable_kv_cache_events = self.enable_kv_cache_events
            pool._events_owner = self
            self._pool = pool
        return self._pool

    @property
    def coordinator(self) -> RemoteCoordinator:
        """The part of vLLM's KVCacheCoordinator its Scheduler reads
        (kvpool.coordinator): per-group block sizes and specs, req_to_blocks
        from this adapter's mirror, get_num_blocks_to_allocate."""
        if self._coord is None:
            self._coord = RemoteCoordinator(self)
        return self._coord

    def pop_blocks_for_free(self, request: RequestLike) -> list[KVCacheBlock]:
        """vLLM 0.33's deferred free: forgets the request and returns its
        blocks, still held (by this session, one Touch), for the caller to
        give back later with block_pool.free_blocks(reversed(blocks))."""
        return self._pop_blocks(request.request_id)

    def _pop_blocks(self, request_id: Any) -> list[KVCacheBlock]:
        self._prefetched = {}
        req = self._reqs.pop(request_id, None)
        if req is None or not req.sent:
            return []
        blocks = [b for row in req.blocks for b in row if not b.is_null]
        if blocks:
            self.client.touch([b.block_id for b in blocks])
            for b in blocks:
                b.ref_cnt += 1
        self.client.free_request(req.wire_id)
        _released(req)
        return blocks

    @property
    def usage(self) -> float:
        return self.client.stats()["usage"]

    def get_computed_blocks(self, request: RequestLike,
                            max_cache_hit_length: Optional[int] = None) -> tuple[Any, ...]:
        """(KVCacheBlocks of the longest cached prefix, its tokens, 0), or
        the pair with shared_prefix_boundary=False. The hit covers at most
        max_cache_hit_length tokens (default num_tokens - 1: the last token
        is always recomputed). No reference is taken. (Typed as a tuple of
        either length, so that both vLLM's pair and its triple unpack.)
        With events on and the request's kv_cache_report_mode "full", the
        hit is reported as vLLM 0.33 does (a BlockStored of the reused
        blocks; RemoteBlockPool.emit_cached_block_events), one more call."""
        found = self._computed(request, max_cache_hit_length)
        if (found[1] and self.enable_kv_cache_events
                and getattr(request, "kv_cache_report_mode", "incremental") == "full"):
            for g, hit in enumerate(found[0].blocks):  # vLLM's coordinator: each group's
                if hit:
                    self.block_pool.emit_cached_block_events(request, len(hit),
                                                             self.groups[g]["block_size"], g)
        if not self._triple:
            self.record_prefix_cache_stats(request, found[1])
            return found[:2]
        return found

    def prefix_cache_lookup_enabled(self, request: RequestLike) -> bool:
        """Whether get_computed_blocks looks the cache up for this request."""
        return self.enable_caching and not getattr(request, "skip_reading_prefix_cache", False)

    def record_prefix_cache_stats(self, request: RequestLike, num_hits: int) -> None:
        """vLLM 0.33's: counts one lookup of num_hits tokens in
        make_prefix_cache_stats(), unless stats are off or the request
        skipped the cache."""
        if self.prefix_cache_stats is None or not self.prefix_cache_lookup_enabled(request):
            return
        self.prefix_cache_stats.record(request.num_tokens, num_hits,
                                       getattr(request, "num_preemptions", 0) > 0)

    def estimate_cached_tokens(self, request: RequestLike) -> int:
        """vLLM 0.33's: the tokens the request's cached blocks cover (its
        prefill metrics read it), as this adapter saw the daemon cache them:
        each prefix-cacheable group's full blocks up to the computed tokens
        at each allocate_slots that was not delay_cache_blocks, the least
        over the groups. A hash another session drops with evict_blocks
        still counts here, where vLLM's own would not."""
        req = self._reqs.get(request.request_id)
        if req is None or not req.cached:
            return 0
        per = [req.cached // spec["block_size"] * spec["block_size"] for spec in self.groups
               if not (spec["kind"] == "mamba" and spec.get("mamba_cache_mode") == "none")]
        return min(per) if per else 0  # a Mamba group without caching is not prefix-cacheable

    def cache_blocks(self, request: RequestLike, num_computed_tokens: int) -> None:
        """vLLM 0.33's Scheduler asks for the request's full blocks up to
        num_computed_tokens to be cached. The daemon caches them at
        allocate_slots already; a request for blocks it has not cached
        (delay_cache_blocks, P/D transfers completing later) is NotSupported:
        the daemon has no call that caches a request's blocks afterwards."""
        if not self.enable_caching:
            return
        if not self._plain or len(self.groups) != 1:
            raise NotSupported(NotSupported.status, "NOT_SUPPORTED", "cache_blocks on a hybrid pool")
        req = self._reqs.get(request.request_id)
        bs = self.groups[0]["block_size"]
        if req is None or num_computed_tokens // bs * bs > req.cached:
            raise NotSupported(NotSupported.status, "NOT_SUPPORTED",
                               "cache_blocks for blocks allocate_slots did not cache")

    def get_block_ids_for_computed_tokens(self, request_id: Any,
                                          num_computed_tokens: int) -> tuple[list[int], ...]:
        """vLLM 0.33's: get_block_ids clipped, in attention groups, to the
        blocks that cover num_computed_tokens; Mamba groups unclipped."""
        out = []
        for spec, ids in zip(self.groups, self.get_block_ids(request_id)):
            if spec["kind"] == "mamba":
                out.append(ids)
            else:
                out.append(ids[:-(-num_computed_tokens // spec["block_size"])])
        return tuple(out)

    def remove_skipped_blocks(self, request_id: Any, processed_computed_tokens: int,
                              num_prompt_tokens: Optional[int] = None) -> None:
        """vLLM 0.33's: the blocks a sparse group no longer needs become the
        null block in the request's table (what get_block_ids and a KV
        connector read). Full attention skips nothing, as in vLLM. Differs
        from vLLM: the daemon frees those blocks at the request's next
        allocate_slots or its free (the same blocks, by the same rule), not
        at this call, which makes no round trip."""
        req = self._reqs.get(request_id)
        if not self._plain and req is not None and req.blocks:
            self._drop_skipped(req, processed_computed_tokens)

    def get_computed_blocks_for_connector(
            self, request: RequestLike,
            max_cache_hit_length: Optional[int] = None) -> tuple[Any, ...]:
        """vLLM 0.33's lookup for a KV connector: get_computed_blocks'
        triple and hit_diverged, which only a hybrid Mamba pool can set and
        get_computed_blocks serves full attention alone: always False."""
        blocks, hit, boundary = self._computed(request, max_cache_hit_length)
        return blocks, hit, boundary, False

    # vLLM 0.33's per-step drains. Each hands over work vLLM's managers queue
    # for its workers: copy-on-write copies of partial hits and Mamba
    # boundary states (neither exists in a kvpool pool: it caches full
    # blocks only and serves full-attention lookups), and the new blocks to
    # zero (needs_kv_cache_zeroing, which this adapter does not record).
    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[KVCacheBlock]]:
        """vLLM 0.33's: drain the groups' queued copy-on-write pairs as
        (copies, the endpoints the Scheduler keeps until the copy ran)."""
        pairs = [pair for view in self.coordinator.single_type_managers
                 for pair in view.take_pending_cow_copies()]
        if not pairs:
            return [], []
        copy_cls = _block_copy_cls()
        return ([copy_cls(src.block_id, dst.block_id) for src, dst in pairs],
                [b for pair in pairs for b in pair])

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        return {}

    def finalize_partial_tail_offloads(self, request: RequestLike) -> list[tuple[int, int, int]]:
        return []

    def take_new_block_ids(self) -> list[int]:
        return []

    def record_blocks_for_zeroing(self, request_id: Any, start_token: int) -> None:
        """vLLM 0.33's: re-records blocks for zeroing. This adapter records
        none (take_new_block_ids is always empty), so there is nothing to do."""

    def truncate_computed_blocks(self, blocks: KVCacheBlocks,
                                 num_computed_tokens: int) -> KVCacheBlocks:
        """vLLM 0.33's: a lookup result cut at a block-aligned token
        endpoint, each group's blocks up to it (a Mamba group's as far as it
        has), references untouched. ValueError where the endpoint is not
        aligned to a group's block size or a group has too few blocks."""
        out = []
        for spec, row in zip(self.groups, blocks.blocks):
            bs = spec["block_size"]
            if num_computed_tokens % bs:
                raise ValueError(f"kvpool: {num_computed_tokens} tokens are not a multiple of "
                                 f"a group's block size {bs}")
            n = num_computed_tokens // bs
            if spec["kind"] == "mamba":
                n = min(n, len(row))
            elif n > len(row):
                raise ValueError(f"kvpool: {num_computed_tokens} tokens need {n} blocks; the "
                                 f"group has {len(row)}")
            out.append(list(row[:n]))
        return self.create_kv_cache_blocks(tuple(out))

    def new_step_starts(self) -> None:
        """vLLM 0.33's Scheduler calls this as each step starts; a remote
        pool keeps no per-step state, so it does nothing."""

    def make_prefix_cache_stats(self) -> Optional[PrefixCacheStats]:
        """The stats since the last call (and a fresh set), or None without log_stats."""
        if self.prefix_cache_stats is None:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, self._stats_cls()
        return stats

    def get_num_common_prefix_blocks(self, running_request_id: Any) -> list[int]:
        """0 for each group, as vLLM 0.33 answers: cascade attention, which
        read it, is gone; vLLM keeps the method for out-of-tree schedulers."""
        return [0] * len(self.groups)

    def _single(self) -> bool:
        """One full-attention group: the hit is a plain prefix lookup."""
        return len(self.groups) == 1 and self.groups[0]["kind"] == "full_attention"

    def _fine(self, request, max_cache_hit_length=None):
        """The hashes get_computed_blocks looks up (vLLM's: at most
        max_cache_hit_length tokens, by default all but the last, which is
        always recomputed), or None where it looks nothing up. One full
        attention group only (the others go to the coordinator lookup)."""
        if not self.prefix_cache_lookup_enabled(request):
            return None
        bs = self.groups[0]["block_size"]
        cap = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
        return request.block_hashes[:max(cap, 0) // bs * (bs // self.hash_block_size)]

    def _computed_groups(self, request, max_cache_hit_length=None):
        """vLLM's coordinator over every group (hybrid, sliding window,
        chunked local, Mamba), in the daemon: (blocks, hit, boundary)."""
        if not self.prefix_cache_lookup_enabled(request) or not request.block_hashes:
            return self.empty_kv_cache_blocks, 0, 0
        cap = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
        ids, refs, hit, uncached = self.client.find_hit(request.block_hashes, max(cap, 0))
        if hit == 0:
            return self.empty_kv_cache_blocks, 0, hit + uncached if uncached else 0
        rows = []
        for g, (gids, grefs) in enumerate(zip(ids, refs)):
            row = []
            for i, r in zip(gids, grefs):
                if i == 0:
                    row.append(self.null_block)
                    continue
                b = self._block(i)
                b.ref_cnt = r
                row.append(b)
            rows.append(row)
        # vLLM 0.33's shared_prefix_boundary: the junction a sparse group has not cached
        return self._blocks_cls(tuple(rows)), hit, hit + uncached if uncached else 0

    def _computed(self, request, max_cache_hit_length=None):
        """(blocks, hit tokens, shared_prefix_boundary)."""
        if not self._single():
            return self._computed_groups(request, max_cache_hit_length)
        fine = self._fine(request, max_cache_hit_length)
        if not fine:
            return self.empty_kv_cache_blocks, 0, 0
        bs = self.groups[0]["block_size"]
        k = bs // self.hash_block_size
        pre = self._prefetched.pop(request.request_id, None) if self._prefetched else None
        if pre is not None and pre[0] == fine:
            ids, refs = pre[1], pre[2]
        else:
            ids, refs = self.client._lookup1(fine, bs)
        blocks, get = [], self._blocks.get
        concat = k > 1 and _concat_keys(self.client.info)
        for j, i in enumerate(ids):
            b = get(i) or self._block(i)
            b.ref_cnt = refs[j]
            if b._block_hash is None:
                b._block_hash = _coarse_hash(fine, j, k, concat) + _GROUP0
            blocks.append(b)
        return self._blocks_cls((blocks,)), len(blocks) * bs, 0

    def prefetch_computed_blocks(self, requests: Iterable[RequestLike]) -> int:
        """Looks up the prefix hits of several requests in one round trip (a
        Batch of Lookups), so that the next get_computed_blocks of each
        answers from it without a call of its own. Not in vLLM's manager:
        a scheduler calls it once per step with the requests it may admit,
        before its loop over them. Returns how many it looked up.

        The answers are what the pool held at this call, as separate calls
        made now would have found. This manager's next allocate_slots,
        free, reset_prefix_cache or Step commit drops the ones not yet
        used (they may be stale after it); a later call on the requests'
        tokens, if they changed, looks up again. A hit that went stale
        anyway (another session evicted it) makes allocate_slots return
        None, as always, and the scheduler retries."""
        self._prefetched = {}
        if not self._single():
            return 0  # each request's coordinator lookup is its own call
        todo = []
        for request in requests:
            fine = self._fine(request)
            if fine:
                todo.append((request.request_id, fine))
        if not todo:
            return 0
        bs = self.groups[0]["block_size"]
        batch = self._take_batch()
        try:
            for _, fine in todo:
                batch.lookup(block_hashes=fine, block_size=bs)
            batch._transmit()
            got = {}
            for i, (rid, fine) in enumerate(todo):
                err, ids, refs = batch._lookup_result(i)
                if err is not None:
                    raise err
                got[rid] = (fine, ids, refs)
            self._prefetched = got
        finally:
            self._give_batch(batch)
        return len(todo)

    def _take_batch(self) -> Batch:
        """The kept Batch (keep going, borrowed arrays), or a new one."""
        batch, self._spare = self._spare, None
        return batch if batch is not None else self.client.batch(keep_going=True, borrow=True)

    def _give_batch(self, batch: Batch) -> None:
        """Clears a Batch and keeps it for the next user, or closes it if one is kept."""
        batch.clear()
        if self._spare is None:
            self._spare = batch
        else:
            batch.close()

    def allocate_slots(self, request: RequestLike, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: Optional[KVCacheBlocks] = None,
                       num_lookahead_tokens: int = 0, num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False, num_encoder_tokens: int = 0,
                       full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       has_scheduled_reqs: bool = True,
                       skip_zeroing_group_ids: tuple[int, ...] = ()) -> Optional[KVCacheBlocks]:
        """The new blocks per group (KVCacheBlocks), or None when the request
        does not fit (nothing changed). vLLM 0.33's last three arguments:
        has_scheduled_reqs only switches vLLM's watermark, which is 0 by
        default and which a remote pool does not apply; nothing here zeroes
        blocks, so skip_zeroing_group_ids changes nothing. reserved_blocks
        (vLLM's gate for async connector loads: the request must fit in the
        free blocks less those) is checked here against the pool's free count
        with one Stats call first; another session may take blocks between
        that check and the allocation, which then fails as any other would."""
        self._prefetched = {}
        if reserved_blocks and not self._fits_reserving(request, num_new_tokens,
                                                        num_new_computed_tokens,
                                                        new_computed_blocks, num_lookahead_tokens,
                                                        num_external_computed_tokens,
                                                        reserved_blocks):
            return None
        kw, req = self._slots_call(request, num_new_tokens, num_new_computed_tokens,
                                   num_lookahead_tokens, num_external_computed_tokens,
                                   delay_cache_blocks, num_encoder_tokens, full_sequence_must_fit)
        try:
            res = self.client.allocate_slots(req.wire_id, **kw)
        except NoSpace:
            self._refused(request, req, num_new_computed_tokens +
                          kw["num_external_computed_tokens"] - kw.get("num_in_flight_tokens", 0))
            return None
        return self._slots_done(request, req, kw, res, num_new_computed_tokens,
                                new_computed_blocks)

    def _fits_reserving(self, request, num_new_tokens, num_new_computed_tokens,
                        new_computed_blocks, num_lookahead_tokens,
                        num_external_computed_tokens, reserved_blocks) -> bool:
        computed = (getattr(request, "num_computed_tokens", 0) + num_new_computed_tokens
                    + num_external_computed_tokens)
        need_tokens = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        hits = (new_computed_blocks.blocks if new_computed_blocks is not None
                else self.empty_kv_cache_blocks.blocks)
        need = self.coordinator.get_num_blocks_to_allocate(request.request_id, need_tokens, hits)
        return need <= self.client.stats()["num_free"] - reserved_blocks

    def free(self, request: RequestLike) -> None:
        """Frees the request's blocks (tail first) and forgets it."""
        self._prefetched = {}
        req = self._reqs.pop(request.request_id, None)
        if req is not None and req.sent:
            self.client.free_request(req.wire_id)
            _released(req)

    def get_block_ids(self, request_id: Any) -> tuple[list[int], ...]:
        """The request's block table per group, as this adapter mirrors it
        (hits, external and new blocks, and the null block where a
        sliding-window, chunked-local or Mamba group has dropped blocks, as
        vLLM's remove_skipped_blocks does)."""
        req = self._reqs.get(request_id)
        if req is None:
            return tuple([] for _ in self.groups)
        return tuple([b.block_id for b in g] for g in req.blocks)

    def get_blocks(self, request_id: Any) -> KVCacheBlocks:
        req = self._reqs.get(request_id)
        return self._blocks_cls(tuple(list(g) for g in req.blocks)) if req else \
            self.empty_kv_cache_blocks

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self._prefetched = {}
        super().evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        self._prefetched = {}
        done = super().reset_prefix_cache()
        if done and self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return done

    def take_events(self) -> list[KVCacheEvent]:
        """The pool's events since the last call, BlockStored annotated with
        its group's kind and window as vLLM's manager does (every session's
        events, in the pool's order)."""
        return self._take_queued()

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        return self._blocks_cls(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def step(self) -> Step:
        """A Step: this scheduler step's allocate_slots and free calls sent as
        one Batch on commit()."""
        return Step(self)

    # ---- shared by the direct calls and Step ----
    def _slots_call(self, request, num_new_tokens, num_new_computed_tokens, num_lookahead_tokens,
                    num_external_computed_tokens, delay_cache_blocks, num_encoder_tokens,
                    full_sequence_must_fit) -> tuple[dict[str, Any], _Req]:
        if num_new_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no "
                             "external computed tokens")
        req = self._reqs.get(request.request_id)
        if req is None:
            req = self._reqs[request.request_id] = _Req(self._next_id, len(self.groups))
            self._next_id += 1
        tokens = request.all_token_ids
        kw = {"num_new_tokens": num_new_tokens, "num_lookahead_tokens": num_lookahead_tokens,
              "delay_cache_blocks": delay_cache_blocks,
              "use_prefix_cache": num_new_computed_tokens > 0,
              "full_sequence_must_fit": full_sequence_must_fit,
              "num_external_computed_tokens": num_external_computed_tokens,
              "no_new_tokens": num_new_tokens == 0}
        if num_encoder_tokens:  # sizes a cross-attention group; the others ignore it
            kw["num_encoder_tokens"] = num_encoder_tokens
        if not self._plain:  # vLLM 0.33 frees skipped blocks below what is not in flight
            kw["num_in_flight_tokens"] = getattr(request, "num_in_flight_tokens", 0) or 0
        if req.sent == 0:
            # The prompt as vLLM counts it (num_prompt_tokens: its partial
            # tail entries), then what a preempted request generated since.
            n = getattr(request, "num_prompt_tokens", None) or len(tokens)
            kw["prompt"] = tokens if n >= len(tokens) else tokens[:n]  # copied as it is added
            if n < len(tokens):
                kw["new_tokens"] = tokens[n:]
            if (getattr(request, "lora_request", None) is not None
                    or getattr(request, "cache_salt", None) is not None
                    or getattr(request, "mm_features", None)
                    or getattr(request, "session_id", None) is not None):
                kw.update(_request_keys(request))
        elif len(tokens) > req.sent:
            kw["new_tokens"] = tokens[req.sent:]
        return kw, req

    def _slots_done(self, request, req, kw, res, num_new_computed_tokens, new_computed_blocks):
        if res.hit_tokens != num_new_computed_tokens:
            # The hit changed since get_computed_blocks: undo, let the scheduler retry.
            self.client.free_request(req.wire_id, preempt=True)
            req.sent = len(request.all_token_ids)
            req.reset(len(self.groups))
            return None
        req.sent = len(request.all_token_ids)
        fresh = not any(req.blocks)
        if num_new_computed_tokens and new_computed_blocks is not None:
            for g, hit in enumerate(new_computed_blocks.blocks):
                for b in hit:
                    if not b.is_null:
                        b.ref_cnt += 1
                req.blocks[g].extend(hit)
        ext = kw.get("num_external_computed_tokens", 0)
        if self._plain and len(res.new_blocks_by_group) == 1:
            # Full attention only: nothing to drop or pad, one row of new blocks.
            return self._plain_done(req, res, kw)
        total_computed = req.computed + num_new_computed_tokens + ext
        self._drop_skipped(req, total_computed - kw.get("num_in_flight_tokens", 0))
        if fresh and ext:
            # vLLM pads a new request's table with nulls for every skipped
            # block, past its hit too when external tokens reach further.
            for g, spec in enumerate(self.groups):
                short = _skipped_blocks(spec, total_computed) - len(req.blocks[g])
                req.blocks[g].extend([self.null_block] * max(short, 0))
        lead = res.external_blocks_by_group or [0] * len(self.groups)
        new = []
        for g, ids in enumerate(res.new_blocks_by_group):
            if ids:
                self._note_state(req, g)
            row = []
            for i in ids:
                b = self.null_block if i == 0 else self._block(i)
                if i != 0:
                    b.ref_cnt = 1
                    b.reset_hash()
                row.append(b)
            req.blocks[g].extend(row)
            # The external tokens' blocks join the table; vLLM returns only the rest.
            new.append(row[lead[g]:])
        req.computed = res.num_computed_tokens
        self._note_cached(req, kw.get("delay_cache_blocks", False))
        return self.create_kv_cache_blocks(tuple(new))

    def _note_cached(self, req, delayed):
        """After an allocate_slots the daemon took: it cached the request's
        full blocks up to its computed tokens or the tokens it has, fewer
        (unless delay_cache_blocks), as vLLM's manager does."""
        if self.enable_caching and not delayed:
            bs = self.groups[0]["block_size"]
            req.cached = max(req.cached, min(req.computed, req.sent) // bs * bs)

    def _plain_done(self, req, res, kw):
        """_slots_done's end on a full-attention-only pool."""
        blocks, row = self._blocks, []
        for i in res.new_blocks_by_group[0]:
            b = blocks.get(i) or self._block(i)
            b.ref_cnt = 1
            b._block_hash = None
            row.append(b)
        req.blocks[0].extend(row)
        req.computed = res.num_computed_tokens
        self._note_cached(req, kw.get("delay_cache_blocks", False))
        lead = res.external_blocks_by_group[0] if res.external_blocks_by_group else 0
        return self._blocks_cls((row[lead:],)) if len(row) > lead else self.empty_kv_cache_blocks

    def _refused(self, request, req, num_new_computed_tokens):
        # num_new_computed_tokens: the hit and the external tokens, as vLLM's
        # total_computed, less the tokens in flight
        """The mirror's side of a NoSpace: a registered request keeps the
        tokens it brought (the daemon appended them before it refused), and
        its skipped blocks are dropped (vLLM frees them even when the step is
        refused); a first call leaves nothing behind."""
        if req.sent:
            req.sent = len(request.all_token_ids)
            self._drop_skipped(req, req.computed + num_new_computed_tokens)

    def _drop_skipped(self, req, num_computed):
        """vLLM's remove_skipped_blocks on the mirror (coordinator.drop_skipped)."""
        drop_skipped(req, self.groups, min(num_computed, self.max_model_len), self.null_block)

    def _note_state(self, req, g):
        """Before group g's table grows (coordinator.note_state)."""
        note_state(req, self.groups, g)
