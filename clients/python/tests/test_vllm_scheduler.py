# SPDX-License-Identifier: Apache-2.0
"""What vLLM's Scheduler asks RemoteKVCacheManager every step besides its
allocations: get_num_common_prefix_blocks (0 per group, as vLLM 0.33
answers) and make_prefix_cache_stats (its hit-rate metrics), against a real
kvpoold, with the counts vLLM's own manager gives."""
import pytest

import kvpool
from kvpool.vllm import PrefixCacheStats, RemoteBlockPool, RemoteKVCacheManager

from conftest import start, stop
from test_vllm import Req


@pytest.fixture(scope="module")
def spools(tmp_path_factory):
    args = []
    for name in ("cp1", "cp2", "st", "ev"):
        args += ["--pool", f"name={name},blocks=32,block_size=4,seed=0,executor=none"]
    args += ["--pool", "name=cph,blocks=64,seed=0,executor=none,"
                       "groups=full:4+sliding_window:4:8"]
    proc, url, _ = start(tmp_path_factory.mktemp("kvpoold-sched"), *args, pool="cp1")
    yield url
    stop(proc)


def _admit(m, req, step):
    """vLLM's admission of a waiting request: its hit, then allocate_slots."""
    blocks, hit, _ = m.get_computed_blocks(req)
    n = req.num_tokens - hit
    if not step:
        return m.allocate_slots(req, n, hit, blocks)
    with m.step() as s:
        s.allocate_slots(req, n, hit, blocks)
        return s.commit()[0]


@pytest.mark.parametrize("pool,step", [("cp1", False), ("cp2", True), ("cph", False)])
def test_common_prefix_is_zero_per_group_as_vllm_0_33(spools, pool, step):
    """vLLM 0.33 removed cascade attention: get_num_common_prefix_blocks
    answers 0 for each group, whatever the requests share."""
    c = kvpool.Client(spools, pool=pool)
    m = RemoteKVCacheManager(c)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    shared = list(range(8))
    a, b = (Req(r, shared + [100 * k + j for j in range(5)], hasher=h)
            for k, r in enumerate(("a", "b"), 1))
    zeros = [0] * len(m.groups)
    assert m.get_num_common_prefix_blocks("a") == zeros
    for r in (a, b):
        # (a hybrid pool's hit is taken inside allocate_slots: no get_computed_blocks yet)
        assert (m.allocate_slots(r, r.num_tokens) if pool == "cph" else _admit(m, r, step)) \
            is not None
    assert m.get_num_common_prefix_blocks("a") == m.get_num_common_prefix_blocks("b") == zeros
    for r in (a, b):
        m.free(r)
    c.close()


def test_prefix_cache_stats_as_vllm_0_33_records_them(spools):
    """vLLM 0.33's shape: get_computed_blocks records nothing; the Scheduler
    calls record_prefix_cache_stats with the hit, which counts unless the
    request skipped the cache."""
    c = kvpool.Client(spools, pool="st")
    m = RemoteKVCacheManager(c, log_stats=True)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    r = Req("q1", range(500, 509), hasher=h)
    blocks, hit, boundary = m.get_computed_blocks(r)
    assert (hit, boundary) == (0, 0)
    assert m.make_prefix_cache_stats() == PrefixCacheStats()
    m.record_prefix_cache_stats(r, hit)
    skip = Req("q2", range(9), hasher=h)
    skip.skip_reading_prefix_cache = True
    assert not m.prefix_cache_lookup_enabled(skip)
    m.record_prefix_cache_stats(skip, 0)
    assert m.make_prefix_cache_stats() == PrefixCacheStats(requests=1, queries=9)
    m.new_step_starts()  # vLLM 0.33's Scheduler calls it each step: nothing to do
    # reserved_blocks: the request's 3 blocks must fit in the free ones less those
    free = c.stats()["num_free"]
    assert m.allocate_slots(r, 9, reserved_blocks=free - 2) is None
    assert c.stats()["num_free"] == free and m.get_block_ids("q1") == ([],)
    with m.step() as s, pytest.raises(kvpool.NotSupported):
        s.allocate_slots(r, 9, reserved_blocks=1)
    assert m.allocate_slots(r, 9, reserved_blocks=free - 3, has_scheduled_reqs=False,
                            skip_zeroing_group_ids=(0,)).get_block_ids() == ([1, 2, 3],)
    m.free(r)
    c.close()


def test_prefix_cache_stats_as_vllm_records_them(spools):
    """The pair shape of vLLM before 0.33 (shared_prefix_boundary=False):
    each get_computed_blocks that looks the cache up adds the request's
    tokens and hit tokens (preempted requests apart); make_prefix_cache_stats
    hands them over and starts again; a reset marks them. Without log_stats
    it returns None, as vLLM's."""
    c = kvpool.Client(spools, pool="st")
    assert RemoteKVCacheManager(c).make_prefix_cache_stats() is None
    m = RemoteKVCacheManager(c, log_stats=True, shared_prefix_boundary=False)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    r1 = Req("r1", range(13), hasher=h)
    m.get_computed_blocks(r1)
    m.allocate_slots(r1, 13)
    r2 = Req("r2", range(13), hasher=h)
    assert m.get_computed_blocks(r2)[1] == 12
    again = Req("r3", range(9), hasher=h)
    again.num_preemptions = 1
    assert m.get_computed_blocks(again)[1] == 8
    skip = Req("r4", range(9), hasher=h)
    skip.skip_reading_prefix_cache = True  # no lookup: not counted
    m.get_computed_blocks(skip)
    assert m.make_prefix_cache_stats() == PrefixCacheStats(
        reset=False, requests=2, queries=26, hits=12, preempted_requests=1,
        preempted_queries=9, preempted_hits=8)
    assert m.make_prefix_cache_stats() == PrefixCacheStats()
    m.free(r1)
    assert m.reset_prefix_cache()
    assert m.make_prefix_cache_stats().reset
    c.close()


def test_manager_evicts_what_a_connector_failed_to_load(spools):
    """KVCacheManager.evict_blocks (vLLM's scheduler calls it for blocks a KV
    connector could not load): the hashes go, and the hit stops before them."""
    c = kvpool.Client(spools, pool="ev")
    m = RemoteKVCacheManager(c)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    r1 = Req("r1", range(13), hasher=h)
    assert m.allocate_slots(r1, 13).get_block_ids() == ([1, 2, 3, 4],)
    m.free(r1)
    r2 = Req("r2", range(13), hasher=h)
    m.prefetch_computed_blocks([r2])
    m.evict_blocks({2})
    blocks, hit, _ = m.get_computed_blocks(r2)  # looked up again: the prefetch is dropped
    assert hit == 4 and blocks.get_block_ids() == ([1],)
    assert c.stats()["num_cached_blocks"] == 2
    c.close()


def test_vllm_0_33_scheduler_members(spools):
    """estimate_cached_tokens, cache_blocks, get_block_ids_for_computed_tokens
    and remove_skipped_blocks as vLLM 0.33's Scheduler calls them, on a full
    attention pool of 4-token blocks."""
    c = kvpool.Client(spools, pool="cp1")
    m = RemoteKVCacheManager(c)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    r = Req("m1", range(7000, 7013), hasher=h)
    assert m.estimate_cached_tokens(r) == 0  # unknown request
    ids = m.allocate_slots(r, 13).get_block_ids()[0]
    assert m.estimate_cached_tokens(r) == 12  # three full blocks of 13 tokens
    m.cache_blocks(r, 12)  # already cached by allocate_slots: nothing to do
    with pytest.raises(kvpool.NotSupported):
        m.cache_blocks(r, 16)  # a block allocate_slots did not cache
    assert m.get_block_ids_for_computed_tokens("m1", 5) == (ids[:2],)
    m.remove_skipped_blocks("m1", 13)  # full attention skips nothing
    assert m.get_block_ids("m1") == (ids,)
    d = Req("m2", range(8000, 8009), hasher=h)
    m.allocate_slots(d, 9, delay_cache_blocks=True)
    assert m.estimate_cached_tokens(d) == 0  # delayed: nothing cached yet
    m.free(r)
    m.free(d)
    c.close()
