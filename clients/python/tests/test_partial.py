# SPDX-License-Identifier: Apache-2.0
"""vLLM 0.33's partial prefix-cache entries over the wire (CachePartial,
MoveHashes) against a real kvpoold: lookups, the snapshot, ownership and
refusals. vLLM's own tests of the same calls run against kvpoold in
test_vllm_own_tests."""
import hashlib

import pytest

import kvpool
from kvpool.vllm import RemoteBlockPool


def _hashes(n, salt=b""):
    return [hashlib.sha256(salt + bytes([i])).digest() for i in range(n)]


@pytest.fixture
def pool(daemon):
    c = kvpool.Client(daemon, pool="bare")
    yield c
    c.close()


def test_partial_entry_is_found_and_snapshotted(pool):
    hs = _hashes(4, b"partial")
    (b,) = pool.allocate(1)
    try:
        # a 64-token block (4 hash blocks of 16) reachable at 32 tokens
        assert pool.cache_partial(b, 32, hs, block_size=64) is True
        assert pool.cache_partial(b, 32, hs, block_size=64) is False  # already there
        ids, _ = pool.lookup_hashes([hs[1]])
        assert ids == [[b]]
        # the full key comes in as the primary's promotion: the partial one goes
        assert pool.cache_hashes([b], hs, 0, 1, block_size=64) == 1
        assert pool.lookup_hashes([hs[1]])[0] == [[]]
        assert pool.lookup_hashes([hs[3]])[0] == [[b]]
        # a shorter boundary on a full block is an extra key; the snapshot shows both
        assert pool.cache_partial(b, 16, hs, block_size=64) is True
        _, _, entries = pool.snapshot()
        assert entries.get((hs[3], 0)) == 1 and entries.get((hs[0], 0)) == 1
        # each block's keys, its primary first (vLLM 0.33's cached_block_hashes_by_block)
        g0 = (0).to_bytes(4, "big")
        (other,) = pool.allocate(1)
        assert pool.block_keys([b, other]) == [[hs[3] + g0, hs[0] + g0], []]
        pool.free([other])
        with pytest.raises(kvpool.OutOfRange):
            pool.block_keys([1 << 20])
        view = RemoteBlockPool(pool).cached_block_hashes_by_block
        assert view == {b: {hs[0] + g0}} and view.get(b) == {hs[0] + g0}
        assert view.get(other) is None and other not in view and len(view) == 1
    finally:
        pool.free([b])


def test_move_hashes_and_refusals(pool, daemon):
    hs = _hashes(2, b"move")
    src, dst = pool.allocate(2)
    other = kvpool.Client(daemon, pool="bare")
    try:
        pool.cache_partial(src, 16, hs, block_size=32)
        pool.move_hashes(src, dst)
        assert pool.lookup_hashes([hs[0]])[0] == [[dst]]
        # another session holds neither block
        with pytest.raises(kvpool.NotOwner):
            other.cache_partial(src, 16, hs, block_size=32)
        with pytest.raises(kvpool.NotOwner):
            other.move_hashes(dst, src)
        # a boundary inside a hash block, a block size that is not a multiple
        with pytest.raises(kvpool.InvalidArgument):
            pool.cache_partial(src, 8, hs, block_size=32)
        with pytest.raises(kvpool.InvalidArgument):
            pool.cache_partial(src, 16, hs, block_size=24)
        # dst already has a key
        pool.cache_partial(src, 32, hs, block_size=32)
        with pytest.raises(kvpool.WrongState):
            pool.move_hashes(src, dst)
        with pytest.raises(TypeError):
            pool.cache_partial("1", 16, hs)
    finally:
        other.close()
        pool.free([src, dst])
