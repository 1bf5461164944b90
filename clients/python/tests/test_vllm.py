# SPDX-License-Identifier: Apache-2.0
"""kvpool.vllm's adapters against a real kvpoold: the reference scenarios
(../shared/reference/scenarios.md B and C, the manager flows of spec
section 5) with vLLM's exact ids, ref counts, hits and events."""
import pytest

import kvpool
from kvpool.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvpool.vllm import RemoteBlockPool, RemoteKVCacheManager

from conftest import start, stop

A, B, C, D = (bytes([c]) * 32 for c in b"ABCD")
iA, iB, iC, iD = (int.from_bytes(x[-8:], "big") for x in (A, B, C, D))
POOLS = {"b2": 10, "b5": 10, "b7": 5, "c1": 6, "c2": 10, "c5": 10, "c6": 10, "m1": 16,
         "m2": 16, "ev": 32, "m3": 4, "m4": 4, "g1": 5, "g2": 5}


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    args = []
    for name, n in POOLS.items():
        extra = ",caching=off" if name == "b7" else ""
        args += ["--pool", f"name={name},blocks={n},block_size=4,seed=0,executor=none,"
                           f"medium=GPU{extra}"]
    for name in ("sw1", "sw2"):  # gpt-oss-like: full attention beside a window of 8
        args += ["--pool", f"name={name},blocks=64,seed=0,executor=none,"
                           "groups=full:4+sliding_window:4:8"]
    proc, url, ev = start(tmp_path_factory.mktemp("kvpoold-vllm"), *args, pool="b2",
                          events=True)
    yield url, ev
    stop(proc)


class Req:
    """The parts of vLLM's Request the adapters read."""

    def __init__(self, request_id, tokens, hashes=None, hasher=None, bs=4):
        self.request_id = request_id
        self.all_token_ids = list(tokens)
        self.block_hashes = hashes if hashes is not None else hasher.hash_request(tokens, bs)
        self.lora_request = None
        self.cache_salt = None
        self.mm_features = None
        self.session_id = None

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


def R(hashes, bs=4):
    return Req("r", range(len(hashes) * bs), hashes=list(hashes))


def ids(blocks):
    return [b.block_id for b in blocks]


def slots(m, step):
    """allocate_slots(req, n, ...) one call per round trip, or (step) as a
    Step of one call: the two must give the same answers."""
    def alloc(req, n, *args, **kw):
        if not step:
            return m.allocate_slots(req, n, *args, **kw)
        with m.step() as s:
            s.allocate_slots(req, n, *args, **kw)
            return s.commit()[0]
    return alloc


def bp(pools, name, events=False):
    url, ev = pools
    return RemoteBlockPool(kvpool.Client(url, pool=name), events, events_url=ev)


def test_b2_b3_allocate_free_usage(pools):
    p = bp(pools, "b2")
    assert p.null_block.block_id == 0 and p.null_block.is_null
    assert p.get_num_free_blocks() == 9 and p.get_usage() == 0.0
    a = p.get_new_blocks(3)
    assert ids(a) == [1, 2, 3] and [b.ref_cnt for b in a] == [1, 1, 1]
    assert p.get_usage() == 0.33333333333333337
    p.free_blocks(reversed(a))
    assert [b.ref_cnt for b in a] == [0, 0, 0]
    # vLLM 0.33: freed blocks with no hash are reused first, in the order freed.
    assert ids(p.get_new_blocks(2)) == [3, 2]
    assert p.get_usage() == 0.2222222222222222
    with pytest.raises(ValueError, match="Cannot get 8 free blocks from the pool"):
        p.get_new_blocks(8)
    assert p.get_num_free_blocks() == 7 and p.get_new_blocks(0) == []
    # The queue is [1,4,5,6,7,8,9]: allocating all of it shows the order.
    assert ids(p.get_new_blocks(7)) == [1, 4, 5, 6, 7, 8, 9]


def test_b5_touch_from_the_middle(pools):
    p = bp(pools, "b5")
    blocks = p.get_new_blocks(3)
    p.cache_full_blocks(R([A, B, C]), blocks, 0, 3, 4, 0)
    p.free_blocks(reversed(blocks))
    hit = p.get_cached_block(B, [0])
    assert ids(hit) == [2] and hit[0].ref_cnt == 0 and hit[0] is blocks[1]
    assert hit[0].block_hash == B + b"\0\0\0\0"
    p.touch(hit)
    assert hit[0].ref_cnt == 1 and p.get_num_free_blocks() == 8
    p.touch(hit)
    p.free_blocks(hit)
    assert p.get_cached_block(B, [0])[0].ref_cnt == 1  # the daemon's count
    p.free_blocks(hit)
    assert ids(p.get_new_blocks(8)) == [4, 5, 6, 7, 8, 9, 3, 1]
    assert ids(p.get_new_blocks(1)) == [2]


def test_b7_caching_off_emits_nothing(pools):
    p = bp(pools, "b7", events=True)
    assert not p.enable_caching
    got = p.get_new_blocks(2)
    assert ids(got) == [1, 2]
    p.free_blocks(reversed(got))
    assert p.take_events() == []
    assert ids(p.get_new_blocks(4)) == [2, 1, 3, 4]  # vLLM 0.33: LIFO without caching


def test_c1_lazy_eviction_and_events(pools):
    p = bp(pools, "c1", events=True)
    blocks = p.get_new_blocks(5)
    assert ids(blocks) == [1, 2, 3, 4, 5]
    p.cache_full_blocks(R([A, B, C]), blocks, 0, 3, 4, 0)
    assert p.take_events() == [BlockStored([iA, iB, iC], None, list(range(12)), 4, None, "GPU",
                                           None, [None, None, None], 0, None, None)]
    p.free_blocks(reversed(blocks))
    assert ids(p.get_new_blocks(3)) == [5, 4, 3]
    assert p.take_events() == [BlockRemoved([iC], "GPU", 0)]
    assert ids(p.get_new_blocks(2)) == [2, 1]
    assert p.take_events() == [BlockRemoved([iB], "GPU", 0), BlockRemoved([iA], "GPU", 0)]
    assert blocks[0].block_hash is None  # evicted on reuse


def test_c2_duplicate_hashes(pools):
    p = bp(pools, "c2", events=True)
    b = p.get_new_blocks(2)
    p.cache_full_blocks(R([D]), b[:1], 0, 1, 4, 0)
    p.cache_full_blocks(R([D]), b[1:], 0, 1, 4, 0)
    assert ids(p.get_cached_block(D, [0])) == [1]
    stored = BlockStored([iD], None, [0, 1, 2, 3], 4, None, "GPU", None, [None], 0)
    assert p.take_events() == [stored, stored]
    p.free_blocks(reversed(b))
    assert ids(p.get_new_blocks(7)) == list(range(3, 10))
    assert p.take_events() == []
    assert ids(p.get_new_blocks(1)) == [2]
    assert p.take_events() == [BlockRemoved([iD], "GPU", 0)]
    assert ids(p.get_cached_block(D, [0])) == [1]
    assert ids(p.get_new_blocks(1)) == [1]
    assert p.get_cached_block(D, [0]) is None


def test_c5_evict_blocks_only_unhashes(pools):
    p = bp(pools, "c5", events=True)
    b = p.get_new_blocks(4)
    p.cache_full_blocks(R([A, B, C]), b, 0, 3, 4, 0)
    p.take_events()
    p.free_blocks(b[:2])
    p.evict_blocks({0, 2, 3, 4})
    assert p.take_events() == [BlockRemoved([iB], "GPU", 0), BlockRemoved([iC], "GPU", 0)]
    assert b[0].block_hash == A + b"\0\0\0\0" and b[1].block_hash is None
    assert [x.ref_cnt for x in b] == [0, 0, 1, 1]
    with pytest.raises(AssertionError, match="Invalid block_id 10 >= 10"):
        p.evict_blocks({10})
    p.free_blocks([b[3], b[2]])  # both unhashed now: to the queue's head (vLLM 0.33)
    assert ids(p.get_new_blocks(9)) == [4, 3, 5, 6, 7, 8, 9, 1, 2]
    assert p.take_events() == [BlockRemoved([iA], "GPU", 0)]


def test_c6_reset_prefix_cache(pools):
    p = bp(pools, "c6", events=True)
    b = p.get_new_blocks(3)
    p.cache_full_blocks(R([A, B, C]), b, 0, 3, 4, 0)
    p.take_events()
    assert p.reset_prefix_cache() is False
    assert p.take_events() == [] and ids(p.get_cached_block(C, [0])) == [3]
    p.free_blocks(reversed(b))
    assert p.reset_prefix_cache() is True
    assert p.take_events() == [AllBlocksCleared()]
    assert all(x.block_hash is None for x in b) and p.get_cached_block(A, [0]) is None
    assert ids(p.get_new_blocks(9)) == [4, 5, 6, 7, 8, 9, 3, 2, 1]


def _manager_flow(m, h, step=False):
    """Spec 5.2-5.5 on Mgr(4, 16): a 13-token prompt, the same prompt again
    (hit 12 tokens: the last token is recomputed), a 12-token prompt (hit 8),
    one decode step, then every request freed tail first."""
    alloc = slots(m, step)

    r1 = Req("r1", range(13), hasher=h)
    blocks, hit, _ = m.get_computed_blocks(r1)
    assert hit == 0 and blocks.get_block_ids() == ([],)
    assert alloc(r1, 13).get_block_ids() == ([1, 2, 3, 4],)
    r2 = Req("r2", range(13), hasher=h)
    blocks, hit, _ = m.get_computed_blocks(r2)
    assert hit == 12 and blocks.get_block_ids() == ([1, 2, 3],)
    assert [b.ref_cnt for b in blocks.blocks[0]] == [1, 1, 1]
    assert alloc(r2, 1, hit, blocks).get_block_ids() == ([5],)
    assert m.get_block_ids("r2") == ([1, 2, 3, 5],)
    assert [b.ref_cnt for b in blocks.blocks[0]] == [2, 2, 2]
    r3 = Req("r3", range(12), hasher=h)
    blocks, hit, _ = m.get_computed_blocks(r3)
    assert hit == 8 and blocks.get_block_ids() == ([1, 2],)
    assert alloc(r3, 4, hit, blocks).get_block_ids() == ([6],)
    # Decode: r2 grows to 14 tokens, which block 5 holds: nothing new.
    r2.all_token_ids.append(99)
    assert alloc(r2, 1).get_block_ids() == ([],)
    # Too much for the pool: None, nothing changed.
    big = Req("big", range(100), hasher=h)
    assert alloc(big, 100) is None
    assert m.client.stats()["num_free"] == 15 - 6
    for r in (r1, r2, r3):
        m.free(r)
    assert m.client.stats()["num_free"] == 15
    assert m.get_block_ids("r1") == ([],)


def test_manager_flows_one_call_per_round_trip(pools):
    url, ev = pools
    c = kvpool.Client(url, pool="m1")
    m = RemoteKVCacheManager(c)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    _manager_flow(m, h)


def test_manager_flows_in_step_mode(pools):
    url, ev = pools
    c = kvpool.Client(url, pool="m2")
    m = RemoteKVCacheManager(c)
    _manager_flow(m, kvpool.Hasher("0", algorithm=c.info["hash_algorithm"]), step=True)


@pytest.mark.parametrize("pool,step", [("m3", False), ("m4", True)])
def test_refused_decode_keeps_its_token_and_retries(pools, pool, step):
    """A decode refused with NoSpace keeps the token it brought (the daemon
    appended it, as vLLM's Request has it): the retry sends nothing again,
    and the block it fills is cached under the request's true tokens."""
    url, ev = pools
    c = kvpool.Client(url, pool=pool)
    m = RemoteKVCacheManager(c)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])

    alloc = slots(m, step)

    r1, r2 = Req("r1", range(4), hasher=h), Req("r2", range(100, 108), hasher=h)
    assert alloc(r1, 4).get_block_ids() == ([1],)
    assert alloc(r2, 8).get_block_ids() == ([2, 3],)
    r1.all_token_ids.append(4)
    assert alloc(r1, 1) is None  # the pool is full
    m.free(r2)
    assert alloc(r1, 1).get_block_ids() == ([3],)  # r2's tail, freed first
    for t in (5, 6, 7):
        r1.all_token_ids.append(t)
        assert alloc(r1, 1).get_block_ids() == ([],)
    probe = Req("p", range(9), hasher=h)
    blocks, hit, _ = m.get_computed_blocks(probe)
    assert hit == 8 and blocks.get_block_ids() == ([1, 3],)
    m.free(r1)
    c.close()


def test_step_mode_equals_direct_calls_on_a_sliding_window_pool(pools):
    """Twenty decode steps of four requests on two identical hybrid pools,
    one call per round trip against Steps (the bulk decode path): the same
    new blocks, block tables (null where the window has passed) and frees."""
    url, ev = pools
    direct, stepped = (RemoteKVCacheManager(kvpool.Client(url, pool=n)) for n in ("sw1", "sw2"))
    h = kvpool.Hasher("0", algorithm=direct.client.info["hash_algorithm"])
    a, b = ([Req(f"r{i}", range(10 * i, 10 * i + 6 + i), hasher=h) for i in range(4)]
            for _ in range(2))
    for n in range(20):
        want = []
        for r in a:
            if n:
                r.all_token_ids.append(1000 + n)
            want.append(direct.allocate_slots(r, 1 if n else r.num_tokens))
        with stepped.step() as s:
            for r in b:
                if n:
                    r.all_token_ids.append(1000 + n)
                s.allocate_slots(r, 1 if n else r.num_tokens)
            got = s.commit()
        assert [x.get_block_ids() for x in got] == [x.get_block_ids() for x in want]
        assert [stepped.get_block_ids(r.request_id) for r in b] == \
            [direct.get_block_ids(r.request_id) for r in a]
    assert 0 in direct.get_block_ids("r0")[1]  # the window has dropped blocks
    assert stepped.client.stats()["num_free"] == direct.client.stats()["num_free"]
    for m, reqs in ((direct, a), (stepped, b)):
        for r in reqs:
            m.free(r)
        assert m.client.stats()["num_free"] == 63
        m.client.close()


def test_manager_events_are_annotated_as_vllms(pools):
    url, ev = pools
    c = kvpool.Client(url, pool="ev")
    m = RemoteKVCacheManager(c, True, events_url=ev)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    r = Req("a", range(9), hasher=h)
    m.allocate_slots(r, 9)
    ints = [int.from_bytes(x[-8:], "big") for x in r.block_hashes]
    assert m.take_events() == [BlockStored(ints, None, list(range(8)), 4, None, "GPU", None,
                                           [None, None], 0, "full_attention", None)]
    m.free(r)
    assert m.take_events() == []
    with m.step() as s:
        s.allocate_slots(Req("b", range(100, 104), hasher=h), 4)
        s.allocate_slots(Req("c", range(200, 400), hasher=h), 200)  # does not fit
        got = s.commit()
    # "a" freed 3, 2, 1: the unhashed 3 went to the queue's head (vLLM 0.33).
    assert got[0].get_block_ids() == ([3],) and got[1] is None
    assert m.get_block_ids("b") == ([3],)


@pytest.mark.parametrize("step", [False, True])
def test_manager_events_carry_the_requests_session_id(pools, step):
    """vLLM 0.33's request.session_id reaches the daemon with the request
    and rides on the BlockStored events it causes, in both call shapes; it
    never enters a hash (the blocks are hits for a request without one)."""
    url, ev = pools
    c = kvpool.Client(url, pool="ev")
    m = RemoteKVCacheManager(c, True, events_url=ev)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    r = Req("s", range(300, 309), hasher=h)
    r.session_id = "chat-%d" % step
    slots(m, step)(r, 9)
    assert len(m.block_pool.kv_event_queue) == 1  # read, not taken: vLLM's pending list
    got = m.take_events()
    assert m.block_pool.kv_event_queue == []
    assert [(type(e).__name__, e.session_id) for e in got] == [("BlockStored", r.session_id)]
    other = Req("t", range(300, 309), hasher=h)
    assert m.get_computed_blocks(other)[1] == 8
    assert m.take_events() == []  # vLLM's default report mode: hits are not reported
    other.kv_cache_report_mode, other.session_id = "full", "chat-x"
    assert m.get_computed_blocks(other)[1] == 8
    (rep,) = m.take_events()  # vLLM 0.33's reuse report: parent None, the hit's tokens
    assert (rep.block_hashes, rep.parent_block_hash, rep.token_ids, rep.session_id) == (
        got[0].block_hashes, None, list(range(300, 308)), "chat-x")
    m.free(r)
    m.client.close()


@pytest.mark.parametrize("pool,step", [("g1", False), ("g2", True)])
def test_full_sequence_must_fit_and_encoder_tokens(pools, pool, step):
    """vLLM's admission gate: a first chunk that fits is refused (None,
    nothing changed) when the whole prompt would not; num_encoder_tokens,
    which only vLLM's cross-attention groups read, changes nothing."""
    url, ev = pools
    c = kvpool.Client(url, pool=pool)
    m = RemoteKVCacheManager(c, shared_prefix_boundary=True)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])

    alloc = slots(m, step)

    big = Req("big", range(24), hasher=h)  # 6 blocks of 4; the pool has 4
    assert alloc(big, 8, full_sequence_must_fit=True) is None
    assert c.stats()["num_free"] == 4 and c.stats()["active_requests"] == 0
    assert alloc(big, 8).get_block_ids() == ([1, 2],)  # chunked prefill, no gate
    m.free(big)
    fits = Req("fits", range(100, 116), hasher=h)  # 4 blocks whole
    got = alloc(fits, 8, full_sequence_must_fit=True, num_encoder_tokens=1500)
    assert len(got.get_block_ids()[0]) == 2
    assert c.stats()["num_free"] == 2
    blocks, hit, boundary = m.get_computed_blocks(Req("p", range(100, 109), hasher=h))
    assert (hit, boundary) == (8, 0) and blocks.get_block_ids() == (got.get_block_ids()[0],)
    m.free(fits)
    c.close()


@pytest.fixture(scope="module")
def xpools(tmp_path_factory):
    """A second daemon (a daemon hosts at most 16 pools): hybrid pools for external tokens."""
    args = []
    for name in ("x1", "x2"):
        args += ["--pool", f"name={name},blocks=64,seed=0,executor=none,"
                           "groups=full:4+sliding_window:4:8"]
    args += ["--pool", "name=x3,blocks=64,seed=0,executor=none,groups=full:4+mamba:4:align"]
    for name, mode in (("x4", "align"), ("x5", "align"), ("x6", "all")):
        args += ["--pool", f"name={name},blocks=64,seed=0,executor=none,"
                           f"groups=full:4+mamba:4:{mode}"]
    args += ["--pool", "name=q1,blocks=8,block_size=4,seed=0,executor=none"]
    args += ["--pool", "name=pf,blocks=16,block_size=4,seed=0,executor=none"]
    proc, url, ev = start(tmp_path_factory.mktemp("kvpoold-ext"), *args, pool="x1")
    yield url, ev
    stop(proc)


def test_step_takes_one_allocate_slots_per_request(xpools):
    """A second allocate_slots for a request in one Step is refused before
    anything is queued (its tokens would go twice); the first call commits
    alone, and the block it fills is cached under the request's true tokens."""
    url, ev = xpools
    c = kvpool.Client(url, pool="q1")
    m = RemoteKVCacheManager(c)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    r = Req("r", range(6), hasher=h)
    assert m.allocate_slots(r, 6).get_block_ids() == ([1, 2],)
    r.all_token_ids += [6, 7]
    with m.step() as s:
        assert s.allocate_slots(r, 2) == 0
        with pytest.raises(ValueError, match="already has an allocate_slots call"):
            s.allocate_slots(r, 2)
        assert s.free(Req("other", range(4), hasher=h)) == 1
        got = s.commit()
    assert [g.get_block_ids() if g else g for g in got] == [([],), None]
    assert m.get_block_ids("r") == ([1, 2],)
    probe = Req("p", range(9), hasher=h)
    blocks, hit, _ = m.get_computed_blocks(probe)
    assert hit == 8 and blocks.get_block_ids() == ([1, 2],)
    # The next step takes the request again.
    r.all_token_ids.append(8)
    with m.step() as s:
        s.allocate_slots(r, 1)
        assert s.commit()[0].get_block_ids() == ([3],)
    m.free(r)
    assert c.stats()["num_free"] == 7
    c.close()


def test_prefetched_hits_are_the_lookups_and_go_stale_on_change(xpools, monkeypatch):
    """prefetch_computed_blocks looks up several requests in one round trip;
    get_computed_blocks then answers each from it, with what a call of its
    own would have returned, and without one. A changed request looks up
    again; the manager's next change to the pool drops what is left."""
    url, ev = xpools
    c = kvpool.Client(url, pool="pf")
    m = RemoteKVCacheManager(c)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    owner = Req("o", range(9), hasher=h)
    m.allocate_slots(owner, 9)  # caches blocks of tokens 0-3 and 4-7
    shares = lambda rid: Req(rid, list(range(8)) + [100 + len(rid)], hasher=h)  # noqa: E731
    b, d, e = shares("b"), shares("dd"), shares("eee")
    alone = Req("c", range(50, 59), hasher=h)
    tiny = Req("t", range(3), hasher=h)  # under a block: nothing to look up
    direct = {r.request_id: m.get_computed_blocks(r) for r in (b, alone)}
    sent = []
    real = c._lookup1
    monkeypatch.setattr(c, "_lookup1", lambda *a: sent.append(a) or real(*a))
    assert m.prefetch_computed_blocks([b, alone, tiny, d, e]) == 4
    for r in (b, alone):
        blocks, hit, _ = m.get_computed_blocks(r)
        want_blocks, want_hit, _ = direct[r.request_id]
        assert hit == want_hit and blocks.get_block_ids() == want_blocks.get_block_ids()
        assert [x.ref_cnt for x in blocks.blocks[0]] == [1] * (hit // 4)  # the owner's
    assert direct["b"][1] == 8 and direct["c"][1] == 0 and sent == []
    assert m.get_computed_blocks(tiny)[1] == 0 and sent == []
    assert m.get_computed_blocks(b)[1] == 8 and len(sent) == 1  # used once, then a call
    d.all_token_ids[5] = 999  # the request changed: its hashes no longer match
    d.block_hashes = h.hash_request(d.all_token_ids, 4)
    assert m.get_computed_blocks(d)[1] == 4 and len(sent) == 2
    with m.step() as s:  # a Step's commit drops the rest (e's)
        s.allocate_slots(b, 1, 8, m.get_computed_blocks(b)[0])
        s.commit()
    assert len(sent) == 3
    assert m.get_computed_blocks(e)[1] == 8 and len(sent) == 4
    m.prefetch_computed_blocks([e])
    m.free(b)  # so does any direct change
    assert m.get_computed_blocks(e)[1] == 8 and len(sent) == 5
    m.prefetch_computed_blocks([e])
    assert m.prefetch_computed_blocks([]) == 0  # a new prefetch replaces the last
    assert m.get_computed_blocks(e)[1] == 8 and len(sent) == 6
    m.free(owner)
    assert c.stats()["num_free"] == 16 - 1
    c.close()
    hybrid = kvpool.Client(url, pool="x1")  # each lookup there is the coordinator's own call
    assert RemoteKVCacheManager(hybrid).prefetch_computed_blocks([b]) == 0
    hybrid.close()


def test_steps_reuse_one_batch_and_a_closed_step_refuses(xpools):
    """A Step takes the Batch a closed Step left (cleared: a call queued
    and not committed is dropped, not sent with the next step); two Steps
    open at once each have their own, and one Batch is kept when both
    close; a closed Step refuses."""
    url, ev = xpools
    c = kvpool.Client(url, pool="q1")
    m = RemoteKVCacheManager(c)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    a, b = Req("a", range(4), hasher=h), Req("b", range(100, 104), hasher=h)
    with m.step() as s:
        first = s._batch
        s.allocate_slots(a, 4)
        (got_a,) = s.commit()[0].get_block_ids()
    assert len(got_a) == 1
    free = c.stats()["num_free"]
    with m.step() as s, m.step() as t:
        assert s._batch is first and t._batch is not first
        second = t._batch
        a.all_token_ids.append(4)
        t.allocate_slots(a, 1)  # never committed
    # t closed first and left its Batch; s's, one too many, was closed.
    assert first._b is None
    with m.step() as s:
        assert s._batch is second and len(s._batch) == 0
        s.allocate_slots(b, 4)
        assert [len(g.get_block_ids()[0]) for g in s.commit()] == [1]
    assert m.get_block_ids("a") == (got_a,)  # the dropped call changed nothing
    assert c.stats()["num_free"] == free - 1
    a.all_token_ids.append(5)  # a decode-shaped call, refused as the others
    for call in (lambda: s.free(a), lambda: s.allocate_slots(Req("n", range(4), hasher=h), 4),
                 lambda: s.allocate_slots(a, 1), s.commit):
        with pytest.raises(ValueError, match="Step is closed"):
            call()
    assert m.get_block_ids("n") == ([],)
    m.free(a)
    m.free(b)
    assert c.stats()["num_free"] == free + 1
    c.close()


@pytest.mark.parametrize("pool,step", [("x1", False), ("x2", True)])
def test_external_tokens_as_a_kv_connector_passes_them(xpools, pool, step):
    """vLLM's num_external_computed_tokens: the connector's 12 tokens get
    blocks in the full-attention group and, past the window's reach, a null
    block in the sliding-window one; they join the table, not the return
    value; an asynchronous load (no new token) allocates them alone."""
    url, ev = xpools
    c = kvpool.Client(url, pool=pool)
    m = RemoteKVCacheManager(c)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])

    alloc = slots(m, step)

    r = Req("r", range(16), hasher=h)
    got = alloc(r, 4, num_external_computed_tokens=12)
    assert got.get_block_ids() == ([6], [7])
    assert m.get_block_ids("r") == ([1, 2, 3, 6], [0, 4, 5, 7])
    assert c.stats()["num_free"] == 63 - 7
    m.free(r)
    a = Req("a", range(100, 113), hasher=h)  # an asynchronous load of 12 tokens
    got = alloc(a, 0, num_external_computed_tokens=12, delay_cache_blocks=True)
    assert got.get_block_ids() == ([], [])
    assert [len(g) for g in m.get_block_ids("a")] == [3, 3]
    assert m.get_block_ids("a")[1][0] == 0
    assert len(alloc(a, 1).get_block_ids()[0]) == 1
    m.free(a)
    with pytest.raises(ValueError):
        alloc(Req("z", range(8), hasher=h), 0)
    assert c.stats()["num_free"] == 63
    c.close()


def test_external_tokens_on_a_mamba_align_pool_are_refused(xpools):
    url, ev = xpools
    c = kvpool.Client(url, pool="x3")
    m = RemoteKVCacheManager(c)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
    with pytest.raises(kvpool.NotSupported, match="Mamba align"):
        m.allocate_slots(Req("r", range(16), hasher=h), 4, num_external_computed_tokens=8)
    assert c.stats()["num_free"] == 63 and c.stats()["active_requests"] == 0
    c.close()


@pytest.mark.parametrize("pool,step", [("x4", False), ("x5", True), ("x6", False)])
def test_mamba_tables_are_mirrored_as_vllm_recycles_them(xpools, pool, step):
    """A Mamba group keeps only the last computed token's state: vLLM frees
    the blocks before it (and in align mode the state block of two steps
    ago) and nulls their places. The mirror's table says so: its live
    blocks are exactly what the pool holds for the request."""
    url, ev = xpools
    c = kvpool.Client(url, pool=pool)
    m = RemoteKVCacheManager(c)
    h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])

    alloc = slots(m, step)

    def live():
        return sum(1 for g in m.get_block_ids("r") for i in g if i != 0)

    r = Req("r", range(8), hasher=h)
    assert alloc(r, 8) is not None
    if pool != "x6":
        # align: one state block, the null block before it (vLLM pads the table)
        assert m.get_block_ids("r") == ([1, 2], [0, 3])
    for t in range(20):
        r.all_token_ids.append(100 + t)
        assert alloc(r, 1) is not None
        assert live() == 63 - c.stats()["num_free"], (t, m.get_block_ids("r"))
    if pool != "x6":
        # 28 tokens computed: full attention holds 7 blocks; Mamba only the last state
        mamba = m.get_block_ids("r")[1]
        assert len(mamba) == 7 and mamba[:-1] == [0] * 6 and mamba[-1] != 0
    m.free(r)
    assert c.stats()["num_free"] == 63
    if pool != "x6":
        # A chunked prefill pads the table between states: the state of two
        # steps ago is freed by vLLM's align rule, not by the skipped walk.
        p = Req("p", range(500, 516), hasher=h)
        alloc(p, 6)
        alloc(p, 10)
        assert m.get_block_ids("p")[1][:3] == [0, m.get_block_ids("p")[1][1], 0]
        p.all_token_ids.append(9)
        alloc(p, 1)
        mamba = m.get_block_ids("p")[1]
        assert mamba[:3] == [0, 0, 0] and mamba[3] != 0 and mamba[4] != 0
        assert sum(1 for g in m.get_block_ids("p") for i in g if i) == 63 - c.stats()["num_free"]
        m.free(p)
    c.close()


@pytest.mark.parametrize("first", ["kvpool.manager", "kvpool.vllm"])
def test_either_adapter_module_imports_first(first):
    """kvpool.manager and kvpool.vllm import each other: either may come first."""
    import os
    import subprocess
    import sys
    code = (f"import {first}\nfrom kvpool.manager import RemoteKVCacheManager, Step\n"
            "from kvpool.vllm import RemoteKVCacheManager as R, Step as S\n"
            "assert R is RemoteKVCacheManager and S is Step\n")
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(kvpool.__file__)))
    env = dict(os.environ, PYTHONPATH=pkg + os.pathsep + os.environ.get("PYTHONPATH", ""))
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 0, got.stderr


def test_partial_entries_through_the_adapter(tmp_path):
    """vLLM 0.33's cache_partial_block and move_block_hashes: the key is the
    fine hash at the boundary, lookups find the block by it, a move re-points it."""
    proc, url, ev = start(tmp_path, "--pool", "name=pt,blocks=6,block_size=4,seed=0,"
                          "executor=none,medium=GPU", pool="pt", events=True)
    try:
        _partial_entries(RemoteBlockPool(kvpool.Client(url, pool="pt"), True, events_url=ev))
    finally:
        stop(proc)


def _partial_entries(p):
    hs = [bytes([i]) * 32 for i in range(1, 5)]
    req = R(hs)
    a, b = p.get_new_blocks(2)
    key = p.cache_partial_block(req, a, 8, 0, 16)
    assert key == hs[1] + b"\0\0\0\0" and a.block_hash == key
    assert p.cache_partial_block(req, p.null_block, 8, 0, 16) is None
    assert ids(p.get_cached_block(hs[1], [0])) == [a.block_id]
    ev = p.take_events()
    assert [type(e).__name__ for e in ev] == ["BlockStored"]
    assert ev[0].block_size == 4 and ev[0].token_ids == [4, 5, 6, 7]
    p.move_block_hashes(a, b)
    assert ids(p.get_cached_block(hs[1], [0])) == [b.block_id] and a.block_hash is None
    with pytest.raises(ValueError):
        p.cache_partial_block(req, a, 6, 0, 16)
    p.free_blocks([a, b])
