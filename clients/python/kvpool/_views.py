# SPDX-License-Identifier: Apache-2.0
"""RemoteBlockPool's read-only views of the pool's structures, for vLLM's
code and tests that read them (never the hot path: each reads the daemon):
the free queue, the hash-to-block map, and each block's partial entries."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Iterator, Optional

from .errors import OutOfRange

if TYPE_CHECKING:
    from .block_pool import KVCacheBlock


class _RemoteFreeQueue:
    __slots__ = ("_pool",)

    def __init__(self, pool):
        self._pool = pool

    @property
    def num_free_blocks(self) -> int:
        return self._pool.client.stats()["num_free"]

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free queue head to tail, as vLLM's: this adapter's block objects."""
        return [self._pool._block(i) for i in self._pool.client.free_queue()]


class _RemoteHashMap:
    __slots__ = ("_pool",)

    def __init__(self, pool):
        self._pool = pool

    def __len__(self) -> int:
        return self._pool.client.stats()["num_cached_keys"]

    def get_one_block(self, key: bytes) -> Optional[KVCacheBlock]:
        """The first block cached under key (hash || 4-byte group), or None."""
        got = self._pool.get_cached_block(key[:-4], [int.from_bytes(key[-4:], "big")])
        return got[0] if got else None

    def _keys(self) -> list[bytes]:
        """Every key cached now (hash || 4-byte group), from one Snapshot."""
        _, _, entries = self._pool.client.snapshot()
        return [h + g.to_bytes(4, "big") for (h, g) in entries]

    def __iter__(self):
        """The keys cached now (a view for tests and debugging: one Snapshot)."""
        return iter(self._keys())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (bytes, bytearray)) and self.get_one_block(bytes(key)) is not None


class _RemoteExtraKeys(Mapping):
    """vLLM 0.33's BlockPool.cached_block_hashes_by_block: for each block
    with partial prefix-cache entries (CachePartial), the set of those keys
    (hash || 4-byte group) beyond its primary one. get(id) is one BlockKeys
    call; iterating reads every block, a page of max-ids at a time."""
    __slots__ = ("_pool",)

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def __getitem__(self, block_id: int) -> set[bytes]:
        if not isinstance(block_id, int) or block_id <= 0:
            raise KeyError(block_id)
        try:
            keys = self._pool.client.block_keys([block_id])[0]
        except OutOfRange:  # an id outside the pool is no key here, as in a dict
            raise KeyError(block_id) from None
        if len(keys) < 2:
            raise KeyError(block_id)
        return set(keys[1:])

    def _all(self) -> dict[int, set[bytes]]:
        c = self._pool.client
        n, page = int(c.info["num_blocks"]), max(1, int(c.info["max_ids_per_call"]))
        out: dict[int, set[bytes]] = {}
        for start in range(1, n, page):
            ids = list(range(start, min(n, start + page)))
            for i, keys in zip(ids, c.block_keys(ids)):
                if len(keys) > 1:
                    out[i] = set(keys[1:])
        return out

    def __iter__(self) -> Iterator[int]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())
