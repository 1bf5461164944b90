# SPDX-License-Identifier: Apache-2.0
"""RemoteKVCacheManager: vLLM's KVCacheManager entry points over the
daemon's request-level calls (AllocateSlots, FreeRequest, Lookup), one
round trip per call, or one Batch per scheduler step (Step)."""
from .errors import NoSpace, NotSupported
from .vllm import KVCacheBlocks, _Remote, _Req, _request_keys


class RemoteKVCacheManager(_Remote):
    """vLLM's KVCacheManager over a remote pool (one Client session).

    A vLLM Request (or any object with request_id, all_token_ids,
    num_tokens, block_hashes and optionally lora_request, cache_salt,
    mm_features, skip_reading_prefix_cache) is registered with the daemon at
    its first allocate_slots; later calls send only the tokens appended
    since. The daemon hashes tokens itself, with the pool's algorithm and
    seed: request.block_hashes must come from the same (kvpool.Hasher with
    the pool's seed) for get_computed_blocks to find what the daemon cached.

    Not exact over a network: the prefix hit that get_computed_blocks
    reports can be evicted by another session before allocate_slots takes
    it; allocate_slots then undoes its call and returns None (as vLLM does
    when a request does not fit), and the scheduler retries it next step.
    Not supported (NotSupported): external (connector) tokens, encoder
    tokens, full_sequence_must_fit, and get_computed_blocks on a pool whose
    only group is not full attention or that has several groups (the hit
    there is vLLM's hybrid fixed point, which the daemon computes inside
    AllocateSlots; Client.allocate_slots(use_prefix_cache=True) takes it and
    reports hit_tokens, but vLLM's two-call shape cannot carry it exactly)."""

    def __init__(self, client, enable_kv_cache_events=False, *, events_url=None, token=None):
        super().__init__(client, enable_kv_cache_events, events_url, token, annotate=True)
        self.max_model_len = client.info["max_model_len"]
        self.groups = client.info["groups"] or [{"kind": "full_attention",
                                                 "block_size": client.info["block_size"]}]
        self.num_kv_cache_groups = len(self.groups)
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in self.groups))
        self._reqs = {}
        self._next_id = 1

    # ---- vLLM's entry points ----
    @property
    def usage(self):
        return self.client.stats()["usage"]

    def get_computed_blocks(self, request):
        """(KVCacheBlocks of the longest cached prefix, its tokens); the last
        token is always recomputed. No reference is taken."""
        if not self.enable_caching or getattr(request, "skip_reading_prefix_cache", False):
            return self.empty_kv_cache_blocks, 0
        if len(self.groups) != 1 or self.groups[0]["kind"] != "full_attention":
            raise NotSupported(NotSupported.status, "NOT_SUPPORTED",
                               "get_computed_blocks on a hybrid or non-full-attention pool: use "
                               "Client.allocate_slots(use_prefix_cache=True), which takes vLLM's "
                               "exact hit in the daemon")
        bs = self.groups[0]["block_size"]
        k = bs // self.hash_block_size
        max_blocks = (request.num_tokens - 1) // bs
        fine = list(request.block_hashes[:max_blocks * k])
        if not fine:
            return self.empty_kv_cache_blocks, 0
        ids, refs = self.client.lookup_hashes(fine, block_size=bs)
        blocks = []
        for j, (i, r) in enumerate(zip(ids[0], refs[0])):
            b = self._block(i)
            b.ref_cnt = r
            if b._block_hash is None:
                b._block_hash = b"".join(fine[j * k:(j + 1) * k]) + (0).to_bytes(4, "big")
            blocks.append(b)
        return KVCacheBlocks((blocks,)), len(blocks) * bs

    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, num_lookahead_tokens=0,
                       num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False):
        """The new blocks per group (KVCacheBlocks), or None when the request
        does not fit (nothing changed)."""
        kw, req = self._slots_call(request, num_new_tokens, num_new_computed_tokens,
                                   num_lookahead_tokens, num_external_computed_tokens,
                                   delay_cache_blocks, num_encoder_tokens, full_sequence_must_fit)
        try:
            res = self.client.allocate_slots(req.wire_id, **kw)
        except NoSpace:
            return None
        return self._slots_done(request, req, kw, res, num_new_computed_tokens,
                                new_computed_blocks)

    def free(self, request):
        """Frees the request's blocks (tail first) and forgets it."""
        req = self._reqs.pop(request.request_id, None)
        if req is not None and req.sent:
            self.client.free_request(req.wire_id)
            _released(req)

    def get_block_ids(self, request_id):
        """The request's block table per group, as this adapter mirrors it
        (hits, new blocks, and the null block where sliding-window and
        chunked-local groups have dropped blocks). Mamba groups: the blocks
        the daemon returned, not vLLM's per-mode recycling."""
        req = self._reqs.get(request_id)
        if req is None:
            return tuple([] for _ in self.groups)
        return tuple([b.block_id for b in g] for g in req.blocks)

    def get_blocks(self, request_id):
        req = self._reqs.get(request_id)
        return KVCacheBlocks(tuple(list(g) for g in req.blocks)) if req else \
            self.empty_kv_cache_blocks

    def take_events(self):
        """The pool's events since the last call, BlockStored annotated with
        its group's kind and window as vLLM's manager does (every session's
        events, in the pool's order)."""
        return self._take_events()

    def create_kv_cache_blocks(self, blocks):
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def step(self):
        """A Step: this scheduler step's allocate_slots and free calls sent as
        one Batch on commit()."""
        return Step(self)

    # ---- shared by the direct calls and Step ----
    def _slots_call(self, request, num_new_tokens, num_new_computed_tokens, num_lookahead_tokens,
                    num_external_computed_tokens, delay_cache_blocks, num_encoder_tokens,
                    full_sequence_must_fit):
        if num_external_computed_tokens or num_encoder_tokens or full_sequence_must_fit:
            raise NotSupported(NotSupported.status, "NOT_SUPPORTED",
                               "external tokens, encoder tokens and full_sequence_must_fit are "
                               "not on kvpool's wire")
        if num_new_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        req = self._reqs.get(request.request_id)
        if req is None:
            req = self._reqs[request.request_id] = _Req(self._next_id, len(self.groups))
            self._next_id += 1
        tokens = request.all_token_ids
        kw = {"num_new_tokens": num_new_tokens, "num_lookahead_tokens": num_lookahead_tokens,
              "delay_cache_blocks": delay_cache_blocks,
              "use_prefix_cache": num_new_computed_tokens > 0}
        if req.sent == 0:
            kw["prompt"] = list(tokens)
            keys = _request_keys(request)
            keys.pop("lora_id")
            kw.update(keys)
        elif len(tokens) > req.sent:
            kw["new_tokens"] = list(tokens[req.sent:])
        return kw, req

    def _slots_done(self, request, req, kw, res, num_new_computed_tokens, new_computed_blocks):
        if res.hit_tokens != num_new_computed_tokens:
            # The hit changed since get_computed_blocks: undo, let the scheduler retry.
            self.client.free_request(req.wire_id, preempt=True)
            req.sent = len(request.all_token_ids)
            req.blocks = [[] for _ in self.groups]
            return None
        req.sent = len(request.all_token_ids)
        if num_new_computed_tokens and new_computed_blocks is not None:
            for g, hit in enumerate(new_computed_blocks.blocks):
                for b in hit:
                    b.ref_cnt += 1
                req.blocks[g].extend(hit)
        total_computed = req.computed + num_new_computed_tokens
        self._drop_skipped(req, total_computed)
        new = []
        for g, ids in enumerate(res.new_blocks_by_group):
            row = []
            for i in ids:
                b = self.null_block if i == 0 else self._block(i)
                if i != 0:
                    b.ref_cnt = 1
                    b.reset_hash()
                row.append(b)
            req.blocks[g].extend(row)
            new.append(row)
        req.computed = res.num_computed_tokens
        return self.create_kv_cache_blocks(tuple(new))

    def _drop_skipped(self, req, num_computed):
        """vLLM's remove_skipped_blocks on the mirror: blocks that left a
        sliding window or a finished local chunk become the null block."""
        for g, spec in enumerate(self.groups):
            bs = spec["block_size"]
            if spec["kind"] == "sliding_window":
                skipped = max(0, num_computed - spec["sliding_window"] + 1) // bs
            elif spec["kind"] == "chunked_local_attention":
                chunk = spec["attention_chunk_size"]
                skipped = (num_computed // chunk * chunk) // bs
            else:
                continue
            row = req.blocks[g]
            for i in range(min(skipped, len(row)) - 1, -1, -1):
                if row[i].is_null:
                    break
                row[i].ref_cnt -= 1
                row[i] = self.null_block


def _released(req):
    """The mirror's side of FreeRequest: each held block loses a reference."""
    for row in req.blocks:
        for b in row:
            if not b.is_null:
                b.ref_cnt -= 1
    req.blocks = []


class Step:
    """One scheduler step's calls as one Batch (keep-going: a request that
    does not fit is refused alone). allocate_slots() and free() queue and
    return the call's index; commit() sends them and returns one result per
    call: KVCacheBlocks or None for allocate_slots, None for free.

    Differs from calling the manager directly in one way that a network
    imposes: the results come back together, so a scheduler decides on
    preemption after the step rather than between its calls."""

    def __init__(self, mgr):
        self._mgr = mgr
        self._batch = mgr.client.batch(keep_going=True, borrow=True)
        self._ops = []

    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, num_lookahead_tokens=0,
                       num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False):
        kw, req = self._mgr._slots_call(request, num_new_tokens, num_new_computed_tokens,
                                        num_lookahead_tokens, num_external_computed_tokens,
                                        delay_cache_blocks, num_encoder_tokens,
                                        full_sequence_must_fit)
        self._batch.allocate_slots(req.wire_id, **kw)
        self._ops.append(("slots", request, req, kw, num_new_computed_tokens,
                          new_computed_blocks))
        return len(self._ops) - 1

    def free(self, request):
        req = self._mgr._reqs.pop(request.request_id, None)
        if req is not None and req.sent:
            self._batch.free_request(req.wire_id)
            self._ops.append(("free", req))
        else:
            self._ops.append(("noop",))
        return len(self._ops) - 1

    def commit(self):
        """Sends the step; one result per queued call, in order."""
        results = self._batch.send() if len(self._batch) else []
        out, k = [], 0
        for op in self._ops:
            if op[0] == "noop":
                out.append(None)
                continue
            r = results[k]
            k += 1
            if op[0] == "free":
                if r.error is not None:
                    raise r.error
                _released(op[1])
                out.append(None)
                continue
            _, request, req, kw, nhit, hit_blocks = op
            if isinstance(r.error, NoSpace):
                out.append(None)
            elif r.error is not None:
                raise r.error
            else:
                out.append(self._mgr._slots_done(request, req, kw, r.slots, nhit, hit_blocks))
        self._batch.clear()
        self._ops.clear()
        return out

    def close(self):
        self._batch.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
