# SPDX-License-Identifier: Apache-2.0
"""kvpool.Batch: several calls in one round trip, run in order under the
pool's lock (a scheduler step), over libkvpool's kvp_batch."""
from __future__ import annotations

import ctypes
from ctypes import byref, c_size_t, c_uint32, c_uint64
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

from . import _lib as L
from ._args import SlotsResult, _hashes, _ids, _keys, _raise, _tokens
from ._types import Hashes, Ids, MMFeatures
from .errors import BY_STATUS, KvpoolError, NotSupported
from .region import Keys
from .region import _keys as _region_keys

if TYPE_CHECKING:
    from .client import Client


@dataclass
class CallResult:
    """One call's outcome: status 0 and its results, or the error it raised
    (a KvpoolError subclass with the daemon's detail) and none."""
    status: int
    error: Optional[KvpoolError] = None
    block_ids: list[int] = field(default_factory=list)
    count: int = 0
    slots: Optional[SlotsResult] = None
    hashes: Optional[list[bytes]] = None
    ref_cnts: Optional[list[int]] = None
    stats: Optional[dict[str, Any]] = None

    @property
    def ok(self) -> bool:
        return self.status == 0


class Batch:
    """Calls added with the methods below (each returns the call's index)
    and sent with send(). keep_going: every call runs and has its own status
    (vLLM's scheduler: a request that does not fit is refused, the step goes
    on); otherwise the batch stops at the first failure and send() raises it.
    borrow: the C library references the arrays this object converted instead
    of copying them once more (they are kept until clear()).

    A Batch is reused step after step: clear() keeps its memory."""

    def __init__(self, client: Client, *, keep_going: bool = False,
                 borrow: bool = False) -> None:
        self._client = client
        self._b: Any = L.BATCH()
        rv = L.kvp_batch_create(byref(self._b))
        if rv != 0:
            self._b = None
            _raise(rv, "cannot create a batch")
        flags = (L.BATCH_CONTINUE if keep_going else 0) | (L.BATCH_BORROW if borrow else 0)
        L.kvp_batch_set_flags(self._b, flags)
        self.keep_going = keep_going
        self._keep: list[tuple[Any, ...]] = []  # what the C batch borrows, until clear()
        self._kinds: list[str] = []
        r = L.BatchResult()
        self._res = (r, byref(r))  # _error's and _slots' reused result

    def close(self) -> None:
        if self._b:
            L.kvp_batch_destroy(self._b)
            self._b = None

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._kinds)

    def clear(self) -> None:
        """Drops every call and result (the memory is kept for the next step)."""
        L.kvp_batch_clear(self._b)
        self._keep.clear()
        self._kinds.clear()

    def _add(self, kind, rv, *keep):
        if rv != 0:
            _raise(rv, f"batch: cannot add {kind}")
        self._keep.append(keep)
        self._kinds.append(kind)
        return len(self._kinds) - 1

    # ---- the calls ----
    def allocate(self, n: int) -> int:
        return self._add("allocate", L.kvp_batch_allocate(self._b, n))

    def touch(self, ids: Ids) -> int:
        a, n = _ids(ids)
        return self._add("touch", L.kvp_batch_touch(self._b, a, n), a)

    def free(self, ids: Ids) -> int:
        a, n = _ids(ids)
        return self._add("free", L.kvp_batch_free(self._b, a, n), a)

    def evict(self, ids: Ids) -> int:
        a, n = _ids(ids)
        return self._add("evict", L.kvp_batch_evict(self._b, a, n), a)

    def stats(self) -> int:
        return self._add("stats", L.kvp_batch_stats(self._b))

    # ---- the shared region's calls by key (as Client.reserve and the rest) ----
    def _region(self, kind, fn, keys, *extra):
        kl = self._client.key_len
        arr, n = _region_keys(keys, kl)
        return self._add(kind, fn(self._b, arr, n, kl, *extra), arr)

    def reserve(self, keys: Keys) -> int:
        """Result: block_ids, a row per key (-1: none needed); hashes, the evicted keys."""
        return self._region("reserve", L.kvp_batch_reserve, keys)

    def commit(self, keys: Keys, crcs: Optional[Sequence[int]] = None) -> int:
        """Reserved keys made visible with their CRC32C (crcs), or none recorded:
        the daemon's own checksums are for a Commit sent alone."""
        kl = self._client.key_len
        arr, n = _region_keys(keys, kl)
        c = None
        if crcs is not None:
            if len(crcs) != n:
                raise ValueError(f"kvpool: {len(crcs)} checksums for {n} keys")
            c = (c_uint32 * max(n, 1))(*crcs)
        return self._add("commit", L.kvp_batch_commit(self._b, arr, n, kl, c), arr, c)

    def abort(self, keys: Keys) -> int:
        return self._region("abort", L.kvp_batch_abort, keys)

    def lookup_and_lock(self, keys: Keys, prefix: bool = False) -> int:
        """Result: block_ids, a row per key looked up (-1: a miss, not locked);
        ref_cnts, each row's CRC32C; count, the hits."""
        return self._region("lookup_and_lock", L.kvp_batch_lookup_lock, keys, prefix)

    def unlock(self, keys: Keys) -> int:
        return self._region("unlock", L.kvp_batch_unlock, keys)

    def cache(self, block_ids: Ids, tokens: Ids, num_full_blocks: int, *,
              num_cached_blocks: int = 0, lora_name: Optional[str] = None,
              lora_path: Optional[str] = None,
              cache_salt: Optional[str] = None, mm: MMFeatures = None,
              group_id: int = 0, session_id: Optional[str] = None) -> int:
        """Client.cache's call (tokens hashed by the daemon)."""
        ids, nids = _ids(block_ids)
        toks, ntok = _tokens(tokens)
        keys, keep = _keys(lora_name, cache_salt, mm, session_id, lora_path)
        a = L.Cache(ids, nids, num_cached_blocks, num_full_blocks, group_id, 0, None, 0, toks,
                    ntok, None, ctypes.pointer(keys) if keys else None, False, 0, None)
        return self._add("cache", L.kvp_batch_cache(self._b, byref(a)), ids, toks, keep, a)

    def lookup(self, tokens: Optional[Ids] = None, *, block_hashes: Optional[Hashes] = None,
               lora_name: Optional[str] = None,
               lora_path: Optional[str] = None, cache_salt: Optional[str] = None,
               mm: MMFeatures = None, group_ids: Sequence[int] = (0,),
               block_size: int = 0) -> int:
        """Client.lookup's call (tokens) or Client.lookup_hashes' (block_hashes;
        block_size as there, 0: the pool's)."""
        toks, ntok = _tokens(tokens)
        hl = self._client.info["hash_len"]
        hs, nh = _hashes(block_hashes, hl) if block_hashes is not None else (None, 0)
        keys, keep = _keys(lora_name, cache_salt, mm, None, lora_path)
        groups = (c_uint32 * max(len(group_ids), 1))(*group_ids)
        q = L.Lookup(hs, nh, toks if tokens is not None else None, ntok,
                     ctypes.pointer(keys) if keys else None, groups, len(group_ids), block_size,
                     hl)
        return self._add("lookup", L.kvp_batch_lookup(self._b, byref(q)), toks, hs, keep, groups,
                         q)

    def allocate_slots(self, request_id: int, *, prompt: Optional[Ids] = None,
                       new_tokens: Optional[Ids] = None, num_new_tokens: int = 0,
                       token_budget: int = 0, num_lookahead_tokens: int = 0,
                       use_prefix_cache: bool = True, delay_cache_blocks: bool = False,
                       lora_name: Optional[str] = None,
                       lora_path: Optional[str] = None, cache_salt: Optional[str] = None,
                       mm: MMFeatures = None, full_sequence_must_fit: bool = False,
                       num_external_computed_tokens: int = 0,
                       no_new_tokens: bool = False, session_id: Optional[str] = None,
                       lora_id: Optional[int] = None, num_in_flight_tokens: int = 0,
                       num_encoder_tokens: int = 0) -> int:
        """Client.allocate_slots' call; a refusal is this call's NoSpace."""
        p, np_ = _tokens(prompt) if prompt is not None else (None, 0)
        t, nt = _tokens(new_tokens) if new_tokens is not None else (None, 0)
        keys, keep = _keys(lora_name, cache_salt, mm, session_id, lora_path)
        a = L.Slots(request_id, p if np_ else None, np_, ctypes.pointer(keys) if keys else None,
                    lora_id is not None, lora_id or 0, t if nt else None, nt, num_new_tokens,
                    token_budget, num_lookahead_tokens, use_prefix_cache, delay_cache_blocks,
                    full_sequence_must_fit, num_external_computed_tokens, no_new_tokens,
                    num_in_flight_tokens, num_encoder_tokens)
        return self._add("allocate_slots", L.kvp_batch_allocate_slots(self._b, byref(a)), p, t,
                         keep, a)

    def free_request(self, request_id: int, preempt: bool = False) -> int:
        return self._add("free_request", L.kvp_batch_free_request(self._b, request_id, preempt))

    def get_computed_blocks(self, request_id: int) -> int:
        return self._add("get_computed_blocks",
                         L.kvp_batch_get_computed_blocks(self._b, request_id))

    # ---- sending ----
    def send(self) -> list[CallResult]:
        """Sends the calls as one Batch; returns one CallResult per call (a
        call that did not run: status NOT_FOUND). Raises a transport failure,
        and without keep_going the first call's failure (with .results)."""
        rv = self._transmit()
        results = [self._result(i) for i in range(len(self._kinds))]
        if rv != 0 and not self.keep_going:
            self._raise_first(rv, results)
        return results

    def _raise_first(self, rv: int, results: list[CallResult]) -> None:
        """Raises the first failed call's error (else the batch's status),
        with every call's result as .results."""
        first = next((r for r in results if r.error is not None), None)
        err = first.error if first and first.error else BY_STATUS.get(rv, KvpoolError)(rv, "?", "")
        err.results = results
        raise err

    def send_rows(self) -> list[tuple[Optional[KvpoolError], list[int]]]:
        """send() for callers that read nothing of a call but its rows (the
        region calls' block_ids): per call, (its error or None, its block
        ids), with none of CallResult's other fields built. Raises as send()."""
        rv = self._transmit()
        r, ref = self._res
        out: list[tuple[Optional[KvpoolError], list[int]]] = []
        for i in range(len(self._kinds)):
            L.kvp_batch_result(self._b, i, ref)
            if r.status != 0:
                out.append((self._result(i).error, []))
            else:
                n = r.num_block_ids
                out.append((None, r.block_ids[:n] if r.has_block_ids and n else []))
        if rv != 0 and not self.keep_going:
            self._raise_first(rv, [self._result(i) for i in range(len(self._kinds))])
        return out

    def _transmit(self):
        """Sends; the batch's status (a transport failure raises)."""
        run = c_size_t()
        with self._client._lock:  # the client's calls are one at a time
            rv = L.kvp_client_batch(self._client._live(), self._b, byref(run))
        if rv != 0 and run.value == 0:
            self._client._check(rv)
        return rv

    def _add_slots_run(self, request_ids, num_new_tokens, num_token_ids, token_ids):
        """len(request_ids) AllocateSlots calls for registered requests in one
        C call (kvp_batch_allocate_slots_n); arrays from the array module."""
        n = len(request_ids)
        ids = (c_uint64 * n).from_buffer(request_ids)
        nnew = (c_uint32 * n).from_buffer(num_new_tokens)
        ntok = (c_uint32 * n).from_buffer(num_token_ids)
        toks = (ctypes.c_int64 * len(token_ids)).from_buffer(token_ids) if token_ids else None
        rv = L.kvp_batch_allocate_slots_n(self._b, n, ids, nnew, ntok, toks, 0, False)
        if rv != 0:
            _raise(rv, "batch: cannot add the AllocateSlots calls")
        self._keep.append((request_ids, num_new_tokens, num_token_ids, token_ids))
        first = len(self._kinds)
        self._kinds.extend(["allocate_slots"] * n)
        return first

    def _lookup_result(self, i):
        """Lookup call i's (None, hit ids, their ref counts), or (its error, None, None)."""
        r, ref = self._res
        L.kvp_batch_result(self._b, i, ref)
        if r.status != 0:
            return self._result(i).error, None, None
        n = r.num_block_ids
        if n and not r.ref_cnts:
            raise NotSupported(NotSupported.status, "NOT_SUPPORTED",
                               "the daemon's Lookup reply has no ref counts (it predates them)")
        return None, r.block_ids[:n] if n else [], r.ref_cnts[:n] if n else []

    def _error(self, i):
        """Call i's error (a KvpoolError), or None if it succeeded; the
        lean read for the calls whose success carries nothing (Step's frees)."""
        r, ref = self._res
        L.kvp_batch_result(self._b, i, ref)
        return None if r.status == 0 else self._result(i).error

    def _slots(self, i):
        """AllocateSlots call i's (SlotsResult, None), or (None, its error)."""
        r, ref = self._res
        L.kvp_batch_result(self._b, i, ref)
        if r.status != 0:
            return None, self._result(i).error
        return _slots_of(r, r.block_ids[:r.num_block_ids] if r.has_block_ids else []), None

    def _result(self, i):
        r = L.BatchResult()
        L.kvp_batch_result(self._b, i, byref(r))
        out = CallResult(r.status)
        if r.status != 0:
            name = L.kvp_status_wire_name(r.status).decode()
            out.error = BY_STATUS.get(r.status, KvpoolError)(
                r.status, name, (r.detail or b"").decode(errors="replace"))
            return out
        n = r.num_block_ids
        if r.has_block_ids and n:
            out.block_ids = r.block_ids[:n]
        out.count = r.count
        if r.ref_cnts:
            out.ref_cnts = r.ref_cnts[:n]
        if r.num_hashes:
            hl = self._client.info["hash_len"] + (4 if self._kinds[i] == "reserve" else 0)
            raw = ctypes.string_at(r.hashes, r.num_hashes * hl)
            out.hashes = [raw[k * hl:(k + 1) * hl] for k in range(r.num_hashes)]
        if r.has_stats:
            out.stats = {name: getattr(r.stats, name) for name, _ in L.Stats._fields_}
        kind = self._kinds[i]
        if kind == "allocate_slots":
            out.slots = _slots_of(r, out.block_ids)
        elif kind in ("lookup", "get_computed_blocks"):
            out.slots = SlotsResult(out.block_ids, r.slots.hit_tokens, 0, 0, None)
        return out


def _slots_of(r, ids):
    """The SlotsResult of a succeeded AllocateSlots' kvp_batch_result r, its
    new block ids (group after group) already read as ids."""
    s = r.slots
    ng = s.num_groups
    if ng == 1:
        rows = [ids]
    else:
        rows, off = [], 0
        for k in s.new_blocks_per_group[:ng]:
            rows.append(ids[off:off + k])
            off += k
    return SlotsResult(ids, s.hit_tokens, s.num_scheduled_tokens, s.num_computed_tokens, rows,
                       s.external_blocks_per_group[:ng])
