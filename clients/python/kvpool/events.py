# SPDX-License-Identifier: Apache-2.0
"""KV cache events with vLLM's classes' field names, the subscriber that
follows a pool's event stream without silently diverging, and the
reference index a KV-aware router keeps."""
from __future__ import annotations

import ctypes
from ctypes import byref, c_uint8
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

from . import _lib as L
from ._args import _raise
from .errors import WrongState

#: A block hash in an event: an int (vLLM's default, the last 8 bytes) or the bytes.
EventHash = Union[int, bytes]


def hash_to_int(h: bytes) -> int:
    """vLLM's default event hash form (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1):
    the last 8 bytes read big-endian."""
    return int.from_bytes(h[-8:], "big")


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[EventHash]
    parent_block_hash: Optional[EventHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str] = None
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    session_id: Optional[str] = None  # vLLM 0.33: the storing request's session_id


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[EventHash]
    medium: Optional[str]
    group_idx: Optional[int] = None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


def _cbor(b, i):
    """One item of the canonical CBOR subset extra keys use (spec 6.4): ints,
    bytes, text, arrays (as tuples), None. Returns (value, next index)."""
    head = b[i]
    major, info = head >> 5, head & 31
    i += 1
    if head == 0xf6:
        return None, i
    if info < 24:
        n = info
    elif 24 <= info <= 27:
        size = 1 << (info - 24)
        n = int.from_bytes(b[i:i + size], "big")
        i += size
    else:
        raise ValueError(f"kvpool: CBOR head 0x{head:02x} is not in the extra-keys subset")
    if major == 0:
        return n, i
    if major == 1:
        return -1 - n, i
    if major == 2:
        return bytes(b[i:i + n]), i + n
    if major == 3:
        return bytes(b[i:i + n]).decode(), i + n
    if major == 4:
        items = []
        for _ in range(n):
            v, i = _cbor(b, i)
            items.append(v)
        return tuple(items), i
    raise ValueError(f"kvpool: CBOR major type {major} is not in the extra-keys subset")


def convert(ev: Any, int_hashes: bool = True,
            annotate: bool = True) -> Union[BlockStored, BlockRemoved, AllBlocksCleared]:
    """A kvpool.events class from a C struct kvp_event (copied out)."""
    conv: Callable[[bytes], EventHash] = bytes
    if int_hashes:
        conv = hash_to_int
    hl = ev.hash_len
    raw = ctypes.string_at(ev.hashes, ev.num_hashes * hl) if ev.num_hashes else b""
    hashes = [conv(raw[k * hl:(k + 1) * hl]) for k in range(ev.num_hashes)]
    medium = ev.medium.decode() if ev.medium else None
    group = ev.group_idx if ev.has_group_idx else None
    if ev.type == L.EVENT_REMOVED:
        return BlockRemoved(hashes, medium, group)
    if ev.type == L.EVENT_CLEARED:
        return AllBlocksCleared()
    parent = conv(ctypes.string_at(ev.parent, hl)) if ev.parent else None
    extra = None
    if ev.extra_keys and ev.num_hashes:
        off = ev.extra_key_offsets
        blob = ctypes.string_at(ev.extra_keys, off[ev.num_hashes])
        extra = [_cbor(blob, off[k])[0] for k in range(ev.num_hashes)]
    kind = ev.spec_kind.decode() if (annotate and ev.spec_kind) else None
    window = ev.sliding_window if (annotate and ev.has_sliding_window) else None
    return BlockStored(hashes, parent, ev.token_ids[:ev.num_tokens], ev.block_size,
                       ev.lora_id if ev.has_lora_id else None, medium,
                       ev.lora_name.decode() if ev.lora_name else None, extra, group, kind,
                       window, ev.session_id.decode() if ev.session_id else None)


@dataclass
class EventBatch:
    """One batch of one pool's stream, delivered in seq order, exactly once."""
    pool: str
    epoch: int
    seq: int
    ts: float
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


@dataclass
class Reset:
    """The subscriber started over from an exact state (at open, after the
    daemon restarted, or when a gap could not be replayed): entries maps
    (hash bytes, group) to how many blocks cache it; batches follow from
    next_seq."""
    pool: str
    epoch: int
    next_seq: int
    entries: dict[tuple[bytes, int], int]


class Subscriber:
    """Follows one or more pools' event streams (libkvpool's subscriber: gap
    repair by Replay, Snapshot on an epoch change or an unrepairable gap;
    sealed streams of pools with a token are opened with it). Iterating
    yields Reset and EventBatch objects; poll() returns what is queued.

        with kvpool.Subscriber(events_url, rpc_url, pools=["default"]) as sub:
            for item in sub.iter(timeout_ms=100):
                ...

    index: keep a kvpool.Index up to date from the stream (sub.index)."""

    def __init__(self, events_url: str, rpc_url: str, *, pools: Sequence[str] = ("default",),
                 token: Optional[str] = None, timeout_ms: int = 5000, index: bool = True,
                 int_hashes: bool = True, tls: Optional[dict[str, Any]] = None) -> None:
        tls = tls or {}
        cs = L.cstr
        if isinstance(pools, (str, bytes)):
            raise TypeError("kvpool: pools is a sequence of pool names, not one name")
        self._names = [cs("a pool name", p, optional=False) for p in pools]
        names = (ctypes.c_char_p * max(len(self._names), 1))(*self._names)
        L.cint("timeout_ms", timeout_ms, 0, (1 << 31) - 1)
        self._strings = [cs("events_url", events_url, optional=False),
                         cs("rpc_url", rpc_url, optional=False), cs("token", token),
                         cs("tls ca_file", tls.get("ca_file")),
                         cs("tls cert_file", tls.get("cert_file")),
                         cs("tls key_file", tls.get("key_file")),
                         cs("tls server_name", tls.get("server_name")), names]
        s = self._strings
        o = L.SubOptions(s[0], s[1], None, names, len(self._names), s[2], timeout_ms, 0, s[3],
                         s[4], s[5], s[6], 0, bool(tls.get("insecure")))
        self._queue: list[Union[Reset, EventBatch]] = []
        self._error: Optional[BaseException] = None
        self.int_hashes = int_hashes
        self.index: Optional[Index] = Index() if index else None
        self._handler = L.SubHandler(None, L.RESET_FN(self._on_reset), L.BATCH_FN(self._on_batch))
        self._s: Any = ctypes.c_void_p()
        rv = L.kvp_sub_open(byref(o), byref(self._handler), byref(self._s))
        if rv != 0:
            self._s = None
            _raise(rv, f"cannot subscribe to {events_url}")

    # The C subscriber calls these from kvp_sub_poll, on this thread.
    def _on_reset(self, _ctx, pool, epoch, next_seq, entries, n):
        try:
            if self.index is not None:
                self.index._reset(entries, n)
            d = {}
            for i in range(n):
                e = entries[i]
                d[(ctypes.string_at(e.hash, e.hash_len), e.group_idx)] = e.num_blocks
            self._queue.append(Reset(pool.decode(), epoch, next_seq, d))
        except Exception as e:  # never unwind through C
            self._error = e

    def _on_batch(self, _ctx, pool, epoch, seq, ts_ns, batch):
        try:
            if self.index is not None:
                self.index._apply(batch)
            ev = L.Event()
            events = []
            for i in range(L.kvp_event_batch_count(batch)):
                L.kvp_event_batch_get(batch, i, byref(ev))
                events.append(convert(ev, self.int_hashes))
            self._queue.append(EventBatch(pool.decode(), epoch, seq, ts_ns / 1e9, events))
        except Exception as e:
            self._error = e

    def poll(self, timeout_ms: int = 0) -> list[Union[Reset, EventBatch]]:
        """Waits up to timeout_ms, repairs gaps, returns what arrived (a list)."""
        if not self._s:
            raise ValueError("kvpool: the subscriber is closed")
        rv = L.kvp_sub_poll(self._s, timeout_ms)
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        if rv != 0:
            d = L.kvp_sub_last_detail(self._s)
            _raise(rv, d.decode(errors="replace") if d else "")
        out, self._queue = self._queue, []
        return out

    def iter(self, timeout_ms: int = 100,
             idle_polls: Optional[int] = None) -> Iterator[Union[Reset, EventBatch]]:
        """Yields Reset and EventBatch objects; stops after idle_polls empty
        polls in a row (None: never)."""
        idle = 0
        while idle_polls is None or idle < idle_polls:
            got = self.poll(timeout_ms)
            idle = 0 if got else idle + 1
            yield from got

    __iter__ = iter

    def stats(self, pool: Optional[str] = None) -> dict[str, Any]:
        st = L.SubStats()
        rv = L.kvp_sub_get_stats(self._s, L.cstr("pool", pool) or None, byref(st))
        if rv != 0:
            _raise(rv, f"pool {pool} is not followed")
        return {name: getattr(st, name) for name, _ in L.SubStats._fields_}

    def fileno(self) -> int:
        """A descriptor that polls readable while stream messages wait, for
        select/selectors or an asyncio loop (loop.add_reader(sub.fileno(),
        ...), then poll(0)). The subscriber owns it: never read or close it."""
        if not self._s:
            raise ValueError("kvpool: the subscriber is closed")
        fd = ctypes.c_int(-1)
        if L.kvp_sub_fd(self._s, ctypes.byref(fd)) != 0:
            raise OSError("kvpool: the subscriber's transport gives no descriptor")
        return fd.value

    def close(self) -> None:
        if getattr(self, "_s", None):
            L.kvp_sub_close(self._s)
            self._s = None
        index = getattr(self, "index", None)
        if index is not None:
            index.close()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class Index:
    """The reference index: (hash, group) -> blocks caching it, fed by a
    Subscriber (libkvpool's kvindex). What a router scores a pool with."""

    def __init__(self) -> None:
        self._ix: Any = ctypes.c_void_p()
        rv = L.kvp_index_create(byref(self._ix))
        if rv != 0:
            self._ix = None
            _raise(rv, "cannot create an index")
        self.diverged = 0  # BlockRemoved events naming nothing (should stay 0)

    def _reset(self, entries, n):
        rv = L.kvp_index_reset(self._ix, entries, n)
        if rv != 0:
            _raise(rv, "index reset")

    def _apply(self, batch):
        rv = L.kvp_index_apply(self._ix, batch)
        if rv == WrongState.status:  # a Removed named nothing: the index had diverged
            self.diverged += 1
        elif rv != 0:
            _raise(rv, "index apply")

    def count(self, block_hash: bytes, group: int = 0) -> int:
        """Blocks caching this (hash, group); 0 if none."""
        h = (c_uint8 * len(block_hash)).from_buffer_copy(block_hash)
        return L.kvp_index_count(self._ix, h, len(block_hash), group)

    def prefix(self, block_hashes: Sequence[bytes], group: int = 0) -> int:
        """How many leading hashes of a chain the index holds in group."""
        if not block_hashes:
            return 0
        hl = len(block_hashes[0])
        raw = b"".join(block_hashes)
        h = (c_uint8 * len(raw)).from_buffer_copy(raw)
        return L.kvp_index_prefix(self._ix, h, len(block_hashes), hl, group)

    def __len__(self) -> int:
        return L.kvp_index_size(self._ix)

    def equals(self, entries: Mapping[tuple[bytes, int], int]) -> bool:
        """True if the index holds exactly these {(hash, group): blocks}
        (for example Client.snapshot()'s)."""
        items = list(entries.items())
        arr = (L.SnapshotEntry * max(len(items), 1))()
        keep = []
        for i, ((h, g), n) in enumerate(items):
            buf = (c_uint8 * len(h)).from_buffer_copy(h)
            keep.append(buf)
            arr[i] = L.SnapshotEntry(ctypes.cast(buf, L.U8P), len(h), g, n)
        return bool(L.kvp_index_equals(self._ix, arr, len(items)))

    def close(self) -> None:
        if getattr(self, "_ix", None):
            L.kvp_index_destroy(self._ix)
            self._ix = None

    def __del__(self) -> None:
        self.close()
