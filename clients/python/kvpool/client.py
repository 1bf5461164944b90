# SPDX-License-Identifier: Apache-2.0
"""kvpool.Client: one session with one pool of a kvpoold, over libkvpool."""
from __future__ import annotations

import ctypes
from ctypes import byref, c_bool, c_int32, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p
from typing import TYPE_CHECKING, Any, Optional, Sequence

from . import _lib as L
from ._types import Buffer, Hashes, Ids, MMFeatures
from ._args import (SlotsResult, _buffer, _group, _hashes, _ids, _keys, _raise,  # noqa: F401
                    _tokens)
from .errors import Internal, KvpoolError, MessageTooLarge, NotFound, NotSupported
from .region import RegionCalls

if TYPE_CHECKING:
    from .batch import Batch


def _serialized(cls):
    """Wraps every public method of cls (and of its mixins) in the client's
    lock: libkvpool's client makes one call at a time (one REQ socket), so
    threads sharing a Client take turns instead of corrupting its state. A
    wrong argument type that only ctypes catches raises TypeError."""
    import functools

    def wrap(fn):
        @functools.wraps(fn)
        def locked(self, *args, **kwargs):
            with self._lock:
                try:
                    return fn(self, *args, **kwargs)
                except ctypes.ArgumentError as e:  # a wrong type that reached ctypes
                    raise TypeError(f"kvpool: {fn.__name__}: {e}") from None
        return locked
    for klass in reversed(cls.__mro__[:-1]):
        for name, fn in list(vars(klass).items()):
            if not name.startswith("_") and callable(fn) and name not in ("batch",):
                setattr(cls, name, wrap(getattr(cls, name)))
    return cls


@_serialized
class Client(RegionCalls):
    """A session with one pool of a kvpoold. A context manager: leaving the
    `with` block ends the session (the daemon releases what it holds).

    Refused calls raise the KvpoolError subclass of their status
    (kvpool.NoSpace, kvpool.NotOwner, ...) with the daemon's detail.

    Thread-safe: threads may share one Client; its calls take turns (the
    session has one connection and one call in flight), so threads that
    want calls in parallel open a Client each."""

    def __init__(self, url: str, pool: Optional[str] = None, token: Optional[str] = None, *,
                 timeout_ms: int = 5000, retries: int = 2, lease_ms: int = 0,
                 client_name: str = "kvpool-python", tls: Optional[dict[str, Any]] = None,
                 session_id: int = 0, connect_timeout_ms: int = 0,
                 vllm_pod: Optional[str] = None) -> None:
        import threading
        self._lock = threading.RLock()  # see _serialized: threads take turns
        self.url = url
        tls = tls or {}
        unknown = set(tls) - {"ca_file", "cert_file", "key_file", "server_name", "insecure"}
        if unknown:
            raise ValueError(f"kvpool: unknown tls keys {sorted(unknown)}")
        cs = L.cstr
        self._strings = [cs("url", url, optional=False), cs("pool", pool), cs("token", token),
                         cs("client_name", client_name), cs("tls ca_file", tls.get("ca_file")),
                         cs("tls cert_file", tls.get("cert_file")),
                         cs("tls key_file", tls.get("key_file")),
                         cs("tls server_name", tls.get("server_name")), cs("vllm_pod", vllm_pod)]
        for name, v in (("timeout_ms", timeout_ms), ("retries", retries), ("lease_ms", lease_ms),
                        ("connect_timeout_ms", connect_timeout_ms)):
            L.cint(name, v, 0, (1 << 31) - 1)
        L.cint("session_id", session_id, 0, (1 << 64) - 1)
        s = self._strings
        o = L.Options(s[0], s[1], s[2], s[3], lease_ms, timeout_ms, retries, s[4], s[5], s[6],
                      s[7], session_id, connect_timeout_ms, bool(tls.get("insecure")), s[8])
        self._scratch = None  # _lookup1's reused structures
        self._c: Any = L.CLIENT()
        rv = L.kvp_client_open(byref(o), byref(self._c))
        if rv != 0:
            self._c = None
            why = L.kvp_client_open_detail().decode(errors="replace")
            _raise(rv, f"cannot open a session with pool {pool or 'default'} at {url}: {why}")
        self._load_info()

    def _load_info(self) -> None:
        """self.info from the library's description of the session and pool."""
        i = L.kvp_client_info(self._c).contents
        ex = i.executor
        self.info = {
            "session_id": i.session_id, "lease_ms": i.lease_ms, "pool": i.pool.decode(),
            "num_blocks": i.num_blocks, "block_size": i.block_size,
            "hash_block_size": i.hash_block_size, "hash_algorithm": i.hash_algorithm.decode(),
            "hash_len": i.hash_len, "max_hash_len": i.max_hash_len,
            "medium": i.medium.decode(), "event_epoch": i.event_epoch,
            # the first 8 bytes of the digest of the pool's NONE_HASH: equal iff hashes agree
            "none_hash_fingerprint": bytes(i.none_hash_fingerprint),
            "event_seq": i.event_seq, "max_model_len": i.max_model_len,
            "max_ids_per_call": i.max_ids_per_call, "max_msg_bytes": i.max_msg_bytes,
            "server_version": i.server_version.decode(),
            "prefix_caching": bool(i.prefix_caching),
            "region": bool(i.region),
            "groups": [_group(i.groups[g]) for g in range(min(i.num_groups, L.MAX_GROUPS))],
            "executor": None if not ex.backend else {
                "backend": ex.backend.decode(), "num_layers": ex.num_layers,
                "num_heads": ex.num_heads, "head_size": ex.head_size,
                "block_size": ex.block_size, "dtype": ex.dtype.decode(),
                "layout": ex.layout.decode(), "block_bytes": ex.block_bytes,
                "memory_bytes": ex.memory_bytes},
        }

    # ---- lifetime ----
    def renew(self) -> None:
        """A new session in place of this one, in one round trip: the daemon
        ends the old one (its locks, reservations and references) as by
        Goodbye, if it still exists. For a session no longer trusted (a
        call timed out, and may still run). info is the new session's."""
        self._check(L.kvp_client_renew(self._live()))
        self._load_info()

    def close(self) -> None:
        """Ends the session. Idempotent."""
        if getattr(self, "_c", None):
            L.kvp_client_close(self._c)
            self._c = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _check(self, rv):
        if rv != 0:
            detail = L.kvp_client_last_detail(self._c) if self._c else None
            _raise(rv, detail.decode(errors="replace") if detail else "")

    def _live(self):
        if not self._c:
            raise KvpoolError(-1, "CLOSED", "the client is closed")
        return self._c

    def check_hasher(self, hasher: "Hasher") -> bool:
        """Whether hasher computes the pool's hashes (its NONE_HASH and algorithm).
        A mismatch gives zero prefix hits with no error anywhere, so it warns
        (once per client) and returns False."""
        same = (hasher.fingerprint == self.info["none_hash_fingerprint"] and
                hasher.algorithm == self.info["hash_algorithm"])
        if not same and not getattr(self, "_warned_hasher", False):
            import warnings
            self._warned_hasher = True
            warnings.warn(f"kvpool: this hasher ({hasher.algorithm}, NONE_HASH fingerprint "
                          f"{hasher.fingerprint.hex()}) does not hash as pool "
                          f"{self.info['pool']} ({self.info['hash_algorithm']}, "
                          f"{self.info['none_hash_fingerprint'].hex()}): no prefix will hit. "
                          "Use the pool's seed (PYTHONHASHSEED's role) and algorithm.",
                          RuntimeWarning, stacklevel=2)
        return same

    # ---- blocks ----
    def allocate(self, n: int) -> list[int]:
        """n free blocks (vLLM's get_new_blocks); NoSpace if fewer are free."""
        c = self._live()
        if not 0 < n <= self.info["max_ids_per_call"]:
            raise ValueError(f"kvpool: allocate {n}: 1..{self.info['max_ids_per_call']}")
        ids = (c_int32 * n)()
        self._check(L.kvp_client_allocate(c, n, ids))
        return list(ids)

    def touch(self, ids: Ids) -> None:
        arr, n = _ids(ids)
        self._check(L.kvp_client_touch(self._live(), arr, n))

    def free(self, ids: Ids) -> None:
        arr, n = _ids(ids)
        self._check(L.kvp_client_free(self._live(), arr, n))

    def evict(self, ids: Ids) -> int:
        arr, n = _ids(ids)
        out = c_uint32()
        self._check(L.kvp_client_evict(self._live(), arr, n, byref(out)))
        return out.value

    def reset(self) -> None:
        self._check(L.kvp_client_reset(self._live()))

    def heartbeat(self) -> None:
        self._check(L.kvp_client_heartbeat(self._live()))

    def stats(self) -> dict[str, Any]:
        st = L.Stats()
        self._check(L.kvp_client_stats(self._live(), byref(st)))
        return {name: getattr(st, name) for name, _ in L.Stats._fields_}

    def free_queue(self, page: int = 4096) -> list[int]:
        """The pool's free queue, head to tail (a read-only view for tests and
        debugging, never the hot path), read a page at a time. A page whose
        last block left the queue meanwhile starts the walk again; after a
        few such restarts the pages read so far are returned as they are."""
        ids = (c_int32 * page)()
        n, more = c_size_t(), c_bool()
        for _ in range(4):
            out: list[int] = []
            after = 0
            while True:
                rv = L.kvp_client_free_queue(self._live(), after, ids, page, byref(n), byref(more))
                if rv == NotFound.status:
                    break  # the queue moved on: start again
                self._check(rv)
                out.extend(ids[:n.value])
                if not more.value or n.value == 0:
                    return out
                after = out[-1]
        return out

    def block_keys(self, ids: Ids) -> list[list[bytes]]:
        """Each block's prefix-cache keys (hash || 4-byte group), its primary
        first, then its partial entries (a view for tests and debugging, as
        vLLM 0.33's cached_block_hashes_by_block); [] for a block with none."""
        arr, n = _ids(ids)
        cap = 8 * n + 64
        while True:
            counts = (c_uint32 * max(n, 1))()
            lens = (c_uint32 * cap)()
            buf = (c_uint8 * (cap * 132))()  # the longest key: 4 x 32-byte hashes and a group
            total = c_size_t()
            rv = L.kvp_client_block_keys(self._live(), arr, n, counts, buf, len(buf), lens, cap,
                                         byref(total))
            if rv != MessageTooLarge.status or cap > 1 << 20:
                break
            cap *= 4
        self._check(rv)
        raw, at, j, out = bytes(buf), 0, 0, []
        for i in range(n):
            keys = []
            for _ in range(counts[i]):
                keys.append(raw[at:at + lens[j]])
                at += lens[j]
                j += 1
            out.append(keys)
        return out

    def cache(self, block_ids: Ids, tokens: Ids, num_full_blocks: int, *,
              num_cached_blocks: int = 0, lora_name: Optional[str] = None,
              lora_path: Optional[str] = None,
              cache_salt: Optional[str] = None, mm: MMFeatures = None,
              group_id: int = 0, session_id: Optional[str] = None) -> int:
        """cache_full_blocks: hashes the request's tokens (vLLM's chain, with
        these extra keys) and stores blocks num_cached_blocks..num_full_blocks-1.
        Returns how many were newly stored."""
        ids, nids = _ids(block_ids)
        toks, ntok = _tokens(tokens)
        keys, keep = _keys(lora_name, cache_salt, mm, session_id, lora_path)
        a = L.Cache(ids, nids, num_cached_blocks, num_full_blocks, group_id, 0, None, 0, toks,
                    ntok, None, ctypes.pointer(keys) if keys else None, False, 0, None)
        out = c_uint32()
        self._check(L.kvp_client_cache(self._live(), byref(a), byref(out)))
        del keep
        return out.value

    def lookup(self, tokens: Ids, *, lora_name: Optional[str] = None,
               lora_path: Optional[str] = None,
               cache_salt: Optional[str] = None,
               mm: MMFeatures = None) -> tuple[list[int], int]:
        """find_longest_cache_hit over the tokens: (block ids, hit tokens)."""
        toks, ntok = _tokens(tokens)
        keys, keep = _keys(lora_name, cache_salt, mm, None, lora_path)
        q = L.Lookup(None, 0, toks, ntok, ctypes.pointer(keys) if keys else None, None, 0, 0, 0)
        cap = max(1, ntok // max(1, self.info["block_size"]) + 1)
        ids = (c_int32 * cap)()
        nb, ht = c_uint32(), c_uint32()
        self._check(L.kvp_client_lookup(self._live(), byref(q), ids, cap, byref(nb), byref(ht)))
        del keep
        return list(ids[:nb.value]), ht.value

    def cache_hashes(self, block_ids: Ids, block_hashes: Hashes, num_cached_blocks: int,
                     num_full_blocks: int, *, block_size: int = 0, group_id: int = 0,
                     tokens: Optional[Ids] = None, lora_name: Optional[str] = None,
                     lora_path: Optional[str] = None,
                     lora_id: Optional[int] = None, cache_salt: Optional[str] = None,
                     mm: MMFeatures = None,
                     block_mask: Optional[Sequence[bool]] = None,
                     session_id: Optional[str] = None) -> int:
        """vLLM's cache_full_blocks with the request's own fine hashes
        (info["hash_len"] bytes each, from position 0) and, for the BlockStored event, its
        tokens from position 0 and extra keys. block_mask: None, or one
        bool per block in [num_cached_blocks, num_full_blocks). Returns how
        many blocks were newly stored."""
        ids, nids = _ids(block_ids)
        hs, nh = _hashes(block_hashes, self.info["hash_len"])
        toks, ntok = _tokens(tokens)
        keys, keep = _keys(lora_name, cache_salt, mm, session_id, lora_path)
        mask = None
        if block_mask is not None:
            bits = bytes(1 if b else 0 for b in block_mask)
            if len(bits) != max(num_full_blocks - num_cached_blocks, 0):
                raise ValueError("kvpool: block_mask needs num_full_blocks - num_cached_blocks "
                                 "entries")
            mask = (c_uint8 * max(len(bits), 1)).from_buffer_copy(bits or b"\0")
        a = L.Cache(ids, nids, num_cached_blocks, num_full_blocks, group_id, block_size, hs, nh,
                    toks if tokens is not None else None, ntok, None,
                    ctypes.pointer(keys) if keys else None, lora_id is not None,
                    lora_id or 0, mask, self.info["hash_len"])
        out = c_uint32()
        self._check(L.kvp_client_cache(self._live(), byref(a), byref(out)))
        del keep
        return out.value

    def cache_partial(self, block_id: int, num_tokens: int, block_hashes: Optional[Hashes] = None,
                      *, block_size: int = 0, group_id: int = 0,
                      tokens: Optional[Ids] = None, lora_name: Optional[str] = None,
                      lora_path: Optional[str] = None,
                      lora_id: Optional[int] = None, cache_salt: Optional[str] = None,
                      mm: MMFeatures = None, replace_existing: bool = False,
                      session_id: Optional[str] = None) -> bool:
        """vLLM 0.33's cache_partial_block: makes block_id (held by this
        session) reachable from the prefix boundary at num_tokens, a multiple
        of the pool's hash block size. block_hashes: the request's fine hashes
        from position 0 (or None: the daemon hashes tokens); tokens also fill
        the BlockStored event. Returns whether a new entry was made."""
        if not isinstance(block_id, int) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise TypeError("kvpool: block_id and num_tokens must be non-negative ints")
        ids, nids = _ids([block_id])
        hs, nh = _hashes(block_hashes or [], self.info["hash_len"])
        toks, ntok = _tokens(tokens)
        keys, keep = _keys(lora_name, cache_salt, mm, session_id, lora_path)
        a = L.Cache(ids, nids, 0, 0, group_id, block_size, hs if block_hashes else None, nh,
                    toks if tokens is not None else None, ntok, None,
                    ctypes.pointer(keys) if keys else None, lora_id is not None,
                    lora_id or 0, None, self.info["hash_len"])
        out = c_bool()
        self._check(L.kvp_client_cache_partial(self._live(), byref(a), num_tokens,
                                               bool(replace_existing), byref(out)))
        del keep
        return out.value

    def report_cached(self, block_hashes: Optional[Hashes], num_blocks: int, *,
                      block_size: int = 0, group_id: int = 0, tokens: Optional[Ids] = None,
                      lora_name: Optional[str] = None,
                      lora_path: Optional[str] = None, lora_id: Optional[int] = None,
                      cache_salt: Optional[str] = None, mm: MMFeatures = None,
                      session_id: Optional[str] = None) -> int:
        """vLLM 0.33's emit_cached_block_events: the pool publishes one
        BlockStored for the request's first num_blocks blocks, its prefix-cache
        hits (block_hashes: its fine hashes from position 0, or None: the
        daemon hashes tokens; tokens also fill the event). Changes nothing
        else. Returns how many it named: the leading blocks still cached, 0
        when the daemon publishes no events."""
        L.cint("num_blocks", num_blocks, 0, (1 << 32) - 1)
        hs, nh = _hashes(block_hashes or [], self.info["hash_len"])
        toks, ntok = _tokens(tokens)
        keys, keep = _keys(lora_name, cache_salt, mm, session_id, lora_path)
        a = L.Cache(None, 0, 0, num_blocks, group_id, block_size, hs if block_hashes else None,
                    nh, toks if tokens is not None else None, ntok, None,
                    ctypes.pointer(keys) if keys else None, lora_id is not None,
                    lora_id or 0, None, self.info["hash_len"])
        out = c_uint32()
        self._check(L.kvp_client_report_cached(self._live(), byref(a), byref(out)))
        del keep
        return out.value

    def move_hashes(self, src_block: int, dst_block: int) -> None:
        """vLLM 0.33's move_block_hashes: every key of src_block now names
        dst_block (which has none); this session holds both. No events."""
        if not isinstance(src_block, int) or not isinstance(dst_block, int):
            raise TypeError("kvpool: block ids must be ints")
        self._check(L.kvp_client_move_hashes(self._live(), src_block, dst_block))

    def lookup_hashes(self, block_hashes: Hashes, *, group_ids: Sequence[int] = (0,),
                      block_size: int = 0) -> tuple[list[list[int]], list[list[int]]]:
        """The longest cached prefix of a hash chain (fine hashes; block_size
        a multiple of the pool's hash block size groups them), all groups or
        nothing per position: ([ids per group], [ref counts per group]),
        the ref counts as the daemon saw them during the call."""
        if group_ids == (0,) or group_ids == [0]:
            ids, refs = self._lookup1(block_hashes, block_size)
            return [ids], [refs]
        hs, nh = _hashes(block_hashes, self.info["hash_len"])
        groups = (c_uint32 * max(len(group_ids), 1))(*group_ids)
        q = L.Lookup(hs, nh, None, 0, None, groups, len(group_ids), block_size,
                     self.info["hash_len"])
        cap = max(1, nh)
        ng = max(len(group_ids), 1)
        ids, refs = (c_int32 * (cap * ng))(), (c_uint32 * (cap * ng))()
        nb, ht = c_uint32(), c_uint32()
        self._check(L.kvp_client_lookup_refs(self._live(), byref(q), ids, refs, cap, byref(nb),
                                             byref(ht)))
        n = nb.value
        return ([list(ids[g * cap:g * cap + n]) for g in range(ng)],
                [list(refs[g * cap:g * cap + n]) for g in range(ng)])

    def find_hit(self, block_hashes: Hashes,
                 max_tokens: int) -> tuple[list[list[int]], list[list[int]], int, int]:
        """vLLM's coordinator lookup (find_longest_cache_hit) over a waiting
        request's fine hashes: the hit every KV cache group agrees on (a
        hybrid pool's fixed point), at most max_tokens tokens. Returns (block
        ids per group, 0 for a null block; their ref counts; hit tokens;
        vLLM 0.33's num_uncached_common_prefix_tokens). No reference taken."""
        L.cint("max_tokens", max_tokens, 0, (1 << 32) - 1)
        hs, nh = _hashes(block_hashes, self.info["hash_len"])
        cap = max(1, nh)
        ng = L.MAX_GROUPS
        ids, refs = (c_int32 * (cap * ng))(), (c_uint32 * (cap * ng))()
        per, hit, unc = (c_uint32 * ng)(), c_uint32(), c_uint32()
        self._check(L.kvp_client_find_hit(self._live(), hs, nh, self.info["hash_len"], max_tokens,
                                          ids, refs, cap, per, byref(hit), byref(unc)))
        groups = len(self.info["groups"] or [None])
        return ([list(ids[g * cap:g * cap + per[g]]) for g in range(groups)],
                [list(refs[g * cap:g * cap + per[g]]) for g in range(groups)],
                hit.value, unc.value)

    def _lookup1(self, block_hashes, block_size):
        """lookup_hashes in group 0: (ids, ref counts). The adapters' hot
        path (one per get_computed_blocks): the call's structures and result
        arrays are this client's, reused (a client is one thread's), so
        Python builds only the hashes' bytes."""
        hl = self.info["hash_len"]
        if not isinstance(block_hashes, (list, tuple)):
            block_hashes = list(block_hashes)
        nh = len(block_hashes)
        if nh and set(map(len, block_hashes)) != {hl}:
            raise ValueError(f"kvpool: block hashes must be {hl} bytes each (vLLM's BlockHash "
                             f"for this pool's hash algorithm)")
        sc = self._scratch
        if sc is None or sc[0] < nh:
            cap = max(nh, 64)
            g0 = (c_uint32 * 1)(0)
            q = L.Lookup(None, 0, None, 0, None, g0, 1, 0, hl)
            nb, ht = c_uint32(), c_uint32()
            sc = self._scratch = (cap, (c_int32 * cap)(), (c_uint32 * cap)(), nb, byref(nb),
                                  byref(ht), q, byref(q), ht, g0)
        cap, ids, refs, nb, nbref, htref, q, qref = sc[:8]
        raw = (c_uint8 * max(nh * hl, 1)).from_buffer_copy(b"".join(block_hashes) or b"\0")
        q.hashes = raw
        q.num_hashes = nh
        q.block_size = block_size
        rv = L.kvp_client_lookup_refs(self._live(), qref, ids, refs, cap, nbref, htref)
        q.hashes = None
        self._check(rv)
        n = nb.value
        return ids[:n], refs[:n]

    def event_position(self) -> tuple[int, int]:
        """(epoch, next_seq) of the pool's event stream now: every event of a
        call that returned before this one is in a batch below next_seq."""
        e, s = c_uint64(), c_uint64()
        self._check(L.kvp_client_event_position(self._live(), byref(e), byref(s)))
        return e.value, s.value

    def snapshot(self) -> tuple[int, int, dict[tuple[bytes, int], int]]:
        """Every cached (hash, group) now: (epoch, next_seq, {(hash, group): blocks})."""
        out = ctypes.POINTER(L.Snapshot)()
        self._check(L.kvp_client_snapshot(self._live(), byref(out)))
        try:
            snap = out.contents
            entries = {}
            for i in range(snap.num_entries):
                e = snap.entries[i]
                entries[(bytes(e.hash[:e.hash_len]), e.group_idx)] = e.num_blocks
            return snap.epoch, snap.next_seq, entries
        finally:
            L.kvp_snapshot_free(out)

    def batch(self, *, keep_going: bool = False, borrow: bool = False) -> Batch:
        """A new kvpool.Batch for this client (see Batch)."""
        from .batch import Batch
        return Batch(self, keep_going=keep_going, borrow=borrow)

    # ---- requests (vLLM's KVCacheManager) ----
    def allocate_slots(self, request_id: int, *, prompt: Optional[Ids] = None,
                       new_tokens: Optional[Ids] = None, num_new_tokens: int = 0,
                       token_budget: int = 0, num_lookahead_tokens: int = 0,
                       use_prefix_cache: bool = True, delay_cache_blocks: bool = False,
                       lora_name: Optional[str] = None,
                       lora_path: Optional[str] = None, cache_salt: Optional[str] = None,
                       mm: MMFeatures = None, full_sequence_must_fit: bool = False,
                       num_external_computed_tokens: int = 0,
                       no_new_tokens: bool = False,
                       session_id: Optional[str] = None,
                       lora_id: Optional[int] = None, num_in_flight_tokens: int = 0,
                       num_encoder_tokens: int = 0) -> SlotsResult:
        """AllocateSlots; NoSpace when vLLM's allocate_slots returns None.
        lora_id: the LoRA adapter's int id, for the request's events only."""
        p, np_ = _tokens(prompt or [])
        t, nt = _tokens(new_tokens or [])
        keys, keep = _keys(lora_name, cache_salt, mm, session_id, lora_path)
        a = L.Slots(request_id, p if prompt else None, np_, ctypes.pointer(keys) if keys else None,
                    lora_id is not None, lora_id or 0, t if new_tokens else None, nt,
                    num_new_tokens, token_budget, num_lookahead_tokens, use_prefix_cache, delay_cache_blocks,
                    full_sequence_must_fit, num_external_computed_tokens, no_new_tokens,
                    num_in_flight_tokens, num_encoder_tokens)
        cap = self.info["max_ids_per_call"]
        out = (c_int32 * cap)()
        res = L.SlotsResult()
        self._check(L.kvp_client_allocate_slots(self._live(), byref(a), out, cap, byref(res)))
        del keep
        flat, rows, off = list(out[:res.num_new_blocks]), [], 0
        for g in range(res.num_groups):
            rows.append(flat[off:off + res.new_blocks_per_group[g]])
            off += res.new_blocks_per_group[g]
        return SlotsResult(flat, res.hit_tokens, res.num_scheduled_tokens,
                           res.num_computed_tokens, rows,
                           list(res.external_blocks_per_group[:res.num_groups]))

    def free_request(self, request_id: int, preempt: bool = False) -> None:
        self._check(L.kvp_client_free_request(self._live(), request_id, preempt))

    def get_computed_blocks(self, request_id: int) -> tuple[list[int], int]:
        """(block ids, hit tokens) of a request's prefix hit."""
        cap = self.info["max_ids_per_call"]
        ids = (c_int32 * cap)()
        n, ht = c_size_t(), c_uint32()
        self._check(L.kvp_client_get_computed_blocks(self._live(), request_id, ids, cap,
                                                     byref(n), byref(ht)))
        return list(ids[:n.value]), ht.value

    # ---- data plane ----
    def read_blocks(self, ids: Ids, out: Optional[Buffer] = None) -> Buffer:
        """The blocks' KV bytes (checksums verified), into `out` (any writable
        C-contiguous buffer of exactly len(ids) * block_bytes) or a new
        bytearray. Returns out."""
        arr, n = _ids(ids)
        bb = self._block_bytes()
        if out is None:
            out = bytearray(n * bb)
        addr, nbytes, keep = _buffer(out, writable=True)
        self._check(L.kvp_client_read_blocks(self._live(), arr, n, addr, nbytes, None))
        del keep
        return out

    def write_blocks(self, ids: Ids, data: Buffer) -> None:
        """Writes len(ids) * block_bytes bytes from any C-contiguous buffer."""
        arr, n = _ids(ids)
        addr, nbytes, keep = _buffer(data, writable=False)
        self._check(L.kvp_client_write_blocks(self._live(), arr, n, addr, nbytes))
        del keep

    def copy_blocks(self, src: Ids, dst: Ids) -> None:
        s, n = _ids(src)
        d, m = _ids(dst)
        if n != m:
            raise ValueError("kvpool: copy_blocks: src and dst differ in length")
        self._check(L.kvp_client_copy_blocks(self._live(), s, d, n))

    def write_tokens(self, slots: Ids, k: Buffer, v: Buffer, *,
                     layer: Optional[int] = None) -> None:
        """vLLM's reshape_and_cache_flash: K and V of len(slots) tokens placed
        by slot (-1 skips a token). With layer=None, k and v hold every layer
        ([layers][n][heads][head_size]), else one layer's ([n][heads][head_size]).
        k and v: any C-contiguous buffers of the pool's dtype, same size."""
        sl, n = _tokens(slots)
        ka, kn, keepk = _buffer(k, writable=False)
        va, vn, keepv = _buffer(v, writable=False)
        if kn != vn:
            raise ValueError("kvpool: write_tokens: k and v differ in size")
        self._check(L.kvp_client_write_tokens(self._live(), layer is None, layer or 0, sl, n,
                                              ka, va, kn))
        del keepk, keepv

    def _block_bytes(self):
        ex = self.info["executor"]
        if ex is None:
            _raise(NotSupported.status, "the pool has no executor (no KV memory)")
        return ex["block_bytes"]


class Hasher:
    """vLLM's block hashes, the same bytes the daemon computes.
    seed: PYTHONHASHSEED's role (NONE_HASH = hash_fn(seed)); None: random.
    Hasher.DEFAULT_SEED is vLLM 0.33's when PYTHONHASHSEED is unset (SHA-256
    algorithms), so Hasher(Hasher.DEFAULT_SEED) hashes as a default vLLM and
    a default kvpoold pool do.
    algorithm: vLLM's --prefix-caching-hash-algo, "sha256" (the default, as
    vLLM's and kvpoold's: pickle bytes), "sha256_cbor" (canonical CBOR), or
    "xxhash" / "xxhash_cbor" (XXH3-128 of the same bytes: 16-byte hashes).
    vllm: whose extra keys, as a pool's vllm= setting: "0.33" (the default:
    tagged keys, a LoRA hashed by name and path) or "9aaf83ef5" (the
    untagged keys vLLM hashed before, a LoRA by its name)."""

    DEFAULT_SEED = "vllm-none-hash"

    def __init__(self, seed: Optional[str | bytes], algorithm: str = "sha256",
                 vllm: str = "0.33") -> None:
        self._h: Any = None
        if vllm not in L.KEYS_FORMS:
            raise ValueError("kvpool: vllm must be one of %s, not %r" % (sorted(L.KEYS_FORMS),
                                                                        vllm))
        algo = ctypes.c_int()
        rv = L.kvp_hash_algo_parse(L.cstr("algorithm", algorithm, optional=False), byref(algo))
        if rv != 0:
            _raise(rv, "unknown hash algorithm %r" % (algorithm,))
        h = c_void_p()
        rv = L.kvp_hasher_create_algo(L.cstr("seed", seed), algo.value, byref(h))
        if rv != 0:
            _raise(rv, "cannot create a hasher")
        self._h = h
        if L.kvp_hasher_set_keys_form(h, L.KEYS_FORMS[vllm]) != 0:
            _raise(Internal.status, "kvp_hasher_set_keys_form")
        self.algorithm = algorithm
        self.vllm = vllm
        self.hash_len = L.kvp_hasher_len(h)

    @property
    def none_hash(self) -> bytes:
        return bytes(L.kvp_hasher_none_hash(self._h)[:L.kvp_hasher_none_len(self._h)])

    @property
    def fingerprint(self) -> bytes:
        """The first 8 bytes of the digest of NONE_HASH, as a pool's
        info["none_hash_fingerprint"]: equal iff this hasher and the pool hash alike."""
        nh = self.none_hash
        out = (c_uint8 * 32)()
        src = (c_uint8 * len(nh)).from_buffer_copy(nh)
        if L.kvp_hash_raw(self._h, src, len(nh), out) != 0:
            _raise(Internal.status, "kvp_hash_raw")
        return bytes(out)[:8]

    def hash_request(self, tokens: Ids, block_size: int, *, lora_name: Optional[str] = None,
                     lora_path: Optional[str] = None,
                     cache_salt: Optional[str] = None, mm: MMFeatures = None) -> list[bytes]:
        """The hashes (hash_len bytes each) of every full block of the tokens,
        with these extra keys (under vLLM 0.33's rules a LoRA needs its path:
        InvalidArgument without it)."""
        L.cint("block_size", block_size, 1, (1 << 31) - 1)
        toks, n = _tokens(tokens)
        cap = max(1, n // block_size)
        hl = self.hash_len
        out = (c_uint8 * (cap * hl))()
        got = c_size_t()
        keys, keep = _keys(lora_name, cache_salt, mm, None, lora_path)
        rv = L.kvp_hash_request(self._h, ctypes.pointer(keys) if keys else None, toks, n,
                                block_size, None, 0, out, cap, byref(got))
        del keep
        if rv != 0:
            _raise(rv, "kvp_hash_request")
        raw = bytes(out)
        return [raw[i * hl:(i + 1) * hl] for i in range(got.value)]

    def close(self) -> None:
        if self._h:
            L.kvp_hasher_destroy(self._h)
            self._h = None

    def __del__(self) -> None:
        self.close()
