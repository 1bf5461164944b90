# SPDX-License-Identifier: Apache-2.0
"""A pytest plugin that runs vLLM's own tests with kvpool deciding every
BlockPool call: loaded with `-p kvpool_swap` (this folder on sys.path)
before vLLM's test modules import BlockPool.

Each vLLM BlockPool the tests (or vLLM's managers, coordinators and
Scheduler) create becomes a KVPoolBlockPool: a pool of the same shape on
a kvpoold of its own (real process, real ipc:// socket), through
kvpool's Python client. Every allocation, reference, free, cache, lookup,
eviction and reset goes to the daemon, whose answer is what the caller
gets. vLLM's own structures (blocks, free_block_queue, the hash map) are
kept beside as the mirror vLLM's tests read, and every daemon answer is
checked against them: a pool id, lookup hit or refusal that differs from
vLLM's raises KVPoolDiverged and fails the test.

vLLM 0.33's partial entries (cache_partial_block, move_block_hashes, and
the managers' direct _maybe_evict_cached_block) go to the daemon too, and so
does a test's own pop from vLLM's hash map (cached_block_hash_to_block.pop or
._cache.pop), as an eviction; putting a popped entry back cannot be
forwarded and raises KVPoolUnsupported. The
one call kvpool has no counterpart for (unpin_blocks) raises
KVPoolUnsupported; a test that
writes vLLM's private structures directly (cached_block_hash_to_block
.insert, blocks[i].ref_cnt = ...) desynchronises the mirror and fails on
the next check. Both are counted by tests/vllm/run_own_tests.sh."""
import sys
import weakref

import swap_daemon  # puts clients/python on sys.path
from kvpool.errors import NoSpace, WrongState
from vllm.v1.core import block_pool as _bp
from vllm.v1.core import kv_cache_coordinator as _coord

VllmBlockPool = _bp.BlockPool
MAX_GROUPS = 8
_live = []


class KVPoolDiverged(AssertionError):
    """kvpool's answer differs from vLLM's own BlockPool's."""


class KVPoolUnsupported(NotImplementedError):
    """A BlockPool call kvpool has no counterpart for."""


def _from_vllm(depth):
    """True when the caller depth frames up is vLLM's own block_pool module."""
    return sys._getframe(depth).f_globals.get("__name__") == _bp.__name__


class _SwapEntries(dict):
    """vLLM's hash map's entries: a test's own pop (cached_block_hash_to_block
    ._cache.pop(key)) drops the entry's blocks in kvpool too, as an eviction."""

    def pop(self, key, *default):
        pool = self._kv_pool()
        if pool is not None and not _from_vllm(2) and key in self:
            got = self[key]
            ids = list(got) if isinstance(got, dict) else [got.block_id]
            pool._kv.evict(sorted(ids))
        return super().pop(key, *default)

    def __setitem__(self, key, value):
        if not _from_vllm(2):
            raise KVPoolUnsupported(
                "a test put an entry back into vLLM's private hash map; kvpool's pool "
                "evicted it when it was popped, and an eviction cannot be undone")
        super().__setitem__(key, value)


class _SwapMap(_bp.BlockHashToBlockMap):
    """vLLM's hash map, whose pop by a test (cached_block_hash_to_block.pop(key,
    block_id), not vLLM's own eviction) evicts that block in kvpool too."""

    def pop(self, key, block_id):
        pool = self._cache._kv_pool()
        if pool is not None and not _from_vllm(2) and self.contain(key, block_id):
            pool._kv.evict([block_id])
        return super().pop(key, block_id)  # its own _cache.pop is vLLM's: not again


def _swap_map(pool, m):
    """m, vLLM's new hash map, made one whose direct pops reach pool's daemon."""
    entries = _SwapEntries(m._cache)
    entries._kv_pool = weakref.ref(pool)
    swapped = _SwapMap()
    swapped._cache = entries
    return swapped


class KVPoolBlockPool(VllmBlockPool):
    # vLLM sets it in __init__ and reset_prefix_cache; tests pop it directly.
    @property
    def cached_block_hash_to_block(self):
        return self.__dict__["_kv_map"]

    @cached_block_hash_to_block.setter
    def cached_block_hash_to_block(self, m):
        self.__dict__["_kv_map"] = m if isinstance(m, _SwapMap) else _swap_map(self, m)

    def __init__(self, num_gpu_blocks, enable_caching, hash_block_size,
                 enable_kv_cache_events=False, metrics_collector=None,
                 num_hash_lookahead_tokens=0, medium=_bp.MEDIUM_GPU):
        super().__init__(num_gpu_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
                         metrics_collector, num_hash_lookahead_tokens, medium)
        groups = "+".join([f"full:{hash_block_size}"] * MAX_GROUPS)
        proc, self._kv, _ = swap_daemon.start(
            f"blocks={num_gpu_blocks},hash_block_size={hash_block_size},groups={groups},"
            f"caching={'on' if enable_caching else 'off'},executor=none,max_model_len=1048576")
        self._kv_proc = proc
        self._kv_inner = 0  # inside one of vLLM's calls that evicts for itself
        self._kv_stop = weakref.finalize(self, swap_daemon.stop, proc, self._kv)
        _live.append(self._kv_stop)

    # ---- calls kvpool decides, checked against vLLM's mirror ----

    def get_new_blocks(self, num_blocks):
        try:
            ids = self._kv.allocate(num_blocks) if num_blocks else []
        except NoSpace:
            ids = None
        try:
            self._kv_inner += 1
            ret = super().get_new_blocks(num_blocks)
        except ValueError:
            if ids is not None:
                raise KVPoolDiverged(f"kvpool allocated {num_blocks}, vLLM refused") from None
            raise
        finally:
            self._kv_inner -= 1
        if ids != [b.block_id for b in ret]:
            raise KVPoolDiverged(f"kvpool allocated {ids}, vLLM {[b.block_id for b in ret]}")
        return ret

    def touch(self, blocks):
        blocks = list(blocks)
        ids = [b.block_id for b in blocks if not b.is_null]
        if ids:
            self._kv.touch(ids)
        super().touch(blocks)

    def free_blocks(self, ordered_blocks):
        blocks = list(ordered_blocks)
        ids = [b.block_id for b in blocks
               if not b.is_null and (b.pool is None or b.pool is self)]
        if ids:
            self._kv.free(ids)
        super().free_blocks(blocks)

    def cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks, block_size,
                          kv_cache_group_id, block_mask=None):
        if num_cached_blocks < num_full_blocks:
            k = block_size // self.hash_block_size
            fine = list(request.block_hashes[:num_full_blocks * k])
            # Only blocks[num_cached:num_full] are read (vLLM's too); the rest are placeholders.
            ids = [0] * num_cached_blocks + [b.block_id for b in
                                             blocks[num_cached_blocks:num_full_blocks]]
            self._kv.cache_hashes(ids, fine,
                                  num_cached_blocks, num_full_blocks, block_size=block_size,
                                  group_id=kv_cache_group_id, tokens=request.all_token_ids,
                                  block_mask=block_mask)
        super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks,
                                  block_size, kv_cache_group_id, block_mask)

    def get_cached_block(self, block_hash, kv_cache_group_ids):
        want = super().get_cached_block(block_hash, kv_cache_group_ids)
        ids, _ = self._kv.lookup_hashes([bytes(block_hash)], group_ids=list(kv_cache_group_ids),
                                        block_size=self.hash_block_size)
        got = [g[0] for g in ids] if ids and ids[0] else None
        if got != (None if want is None else [b.block_id for b in want]):
            raise KVPoolDiverged(f"kvpool's lookup found {got}, vLLM's "
                                 f"{None if want is None else [b.block_id for b in want]}")
        return want

    def evict_blocks(self, block_ids):
        ids = sorted(block_ids)
        if ids and max(ids) < self.num_gpu_blocks and min(ids) >= 0:
            self._kv.evict(ids)
        self._kv_inner += 1
        try:
            super().evict_blocks(block_ids)
        finally:
            self._kv_inner -= 1

    def _maybe_evict_cached_block(self, block):
        # vLLM 0.33's Mamba manager calls this directly; inside get_new_blocks
        # and evict_blocks the daemon has already evicted.
        if self._kv_inner == 0 and not block.is_null:
            self._kv.evict([block.block_id])
        return super()._maybe_evict_cached_block(block)

    def reset_prefix_cache(self):
        try:
            self._kv.reset()
            ours = True
        except WrongState:
            ours = False
        theirs = super().reset_prefix_cache()
        if ours != theirs:
            raise KVPoolDiverged(f"kvpool's reset said {ours}, vLLM's {theirs}")
        return theirs

    def cache_partial_block(self, request, block, num_tokens, kv_cache_group_id, block_size,
                            replace_existing_hashes=False):
        ours, err = None, None
        if not block.is_null:
            key = _bp.make_block_hash_with_group_id(
                request.block_hashes[num_tokens // self.hash_block_size - 1], kv_cache_group_id) \
                if 0 < num_tokens // self.hash_block_size <= len(request.block_hashes) else None
            already = key is not None and not replace_existing_hashes and (
                block.block_hash == key
                or self.cached_block_hash_to_block.contain(key, block.block_id))
            try:
                nh = num_tokens // self.hash_block_size
                ours = self._kv.cache_partial(
                    block.block_id, num_tokens, list(request.block_hashes[:max(nh, 1)]),
                    block_size=block_size, group_id=kv_cache_group_id,
                    tokens=request.all_token_ids, replace_existing=replace_existing_hashes)
            except Exception as e:  # compared with vLLM's outcome below
                err = e
        ret = super().cache_partial_block(request, block, num_tokens, kv_cache_group_id,
                                          block_size, replace_existing_hashes)
        if err is not None:
            raise KVPoolDiverged(f"kvpool refused cache_partial_block ({err}), vLLM did not")
        if not block.is_null and ours != (not already):
            raise KVPoolDiverged(f"kvpool's cache_partial_block stored={ours}, vLLM's "
                                 f"{not already}")
        return ret

    def move_block_hashes(self, src_block, dst_block):
        self._kv.move_hashes(src_block.block_id, dst_block.block_id)
        super().move_block_hashes(src_block, dst_block)

    # ---- calls kvpool has no counterpart for ----

    def unpin_blocks(self, *a, **k):
        raise KVPoolUnsupported("unpin_blocks: kvpool has no reuse watchers")


def _install():
    _bp.BlockPool = KVPoolBlockPool
    _coord.BlockPool = KVPoolBlockPool
    for name, mod in list(sys.modules.items()):
        if name.startswith("vllm.") and getattr(mod, "BlockPool", None) is VllmBlockPool:
            mod.BlockPool = KVPoolBlockPool


_install()


def pytest_runtest_teardown(item, nextitem):
    """Each test's pools are checked against the daemon's, then stopped."""
    import gc
    gc.collect()
    while _live:
        f = _live.pop()
        f()


def pytest_report_header(config):
    return "kvpool_swap: vLLM's BlockPool is kvpool's (a kvpoold per pool), checked against vLLM's"
