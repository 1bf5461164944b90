# SPDX-License-Identifier: Apache-2.0
"""kvpool against the installed vLLM 0.33 (its own classes, not copies):
hashes, free order, coarse-block keys and the event wire. Run with the
environment tests/vllm/env.sh makes; skipped where vLLM is not installed."""
import os
import random
import socket
import sys
import time
from types import SimpleNamespace

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"these tests pin vLLM 0.33, not {vllm.__version__}", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import msgspec  # noqa: E402
import zmq  # noqa: E402
from vllm.distributed import kv_events as vke  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils as vku  # noqa: E402
from vllm.v1.core.block_pool import BlockPool  # noqa: E402

import kvpool  # noqa: E402
from kvpool.vllm import RemoteBlockPool  # noqa: E402

from conftest import start, stop  # noqa: E402


def _vllm_hashes(tokens, block_size, algo="sha256"):
    """A default vLLM 0.33's block hashes (PYTHONHASHSEED unset)."""
    fn = get_hash_fn_by_name(algo)
    vku.init_none_hash(fn)
    out, parent = [], None
    for i in range(len(tokens) // block_size):
        parent = vku.hash_block_tokens(fn, parent, tokens[i * block_size:(i + 1) * block_size],
                                       None)
        out.append(parent)
    return out


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    procs = []

    def run(*pools, extra=()):
        args = list(extra)
        for p in pools:
            args += ["--pool", p]
        name = pools[0].split(",")[0].split("=")[1]
        proc, url, _ = start(tmp_path, *args, pool=name)
        procs.append(proc)
        return url
    yield run
    for p in procs:
        stop(p)


def test_a_default_pool_hashes_as_a_default_vllm(daemon, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    url = daemon("name=d,blocks=32,block_size=16,executor=none")
    tokens = list(range(1000, 1064))
    want = _vllm_hashes(tokens, 16)
    assert vku.get_none_hash_seed() == "vllm-none-hash"
    assert kvpool.Hasher(kvpool.Hasher.DEFAULT_SEED).hash_request(tokens, 16) == want
    with kvpool.Client(url, pool="d") as c:
        assert c.info["hash_algorithm"] == "sha256"
        ids = c.allocate(4)
        assert c.cache(ids, tokens, 4) == 4  # the daemon hashes the tokens
        assert c.lookup_hashes(want)[0] == [ids]  # vLLM's hashes find them
        c.free(ids)


def test_xxhash_pools_keep_a_random_seed_as_vllm(daemon):
    url = daemon("name=x,blocks=8,block_size=4,executor=none,hash_algo=xxhash")
    tokens = list(range(8))
    with kvpool.Client(url, pool="x") as c:
        ids = c.allocate(2)
        c.cache(ids, tokens, 2)
        # vLLM 0.33 draws a random seed for xxhash: nothing can match by default.
        assert c.lookup_hashes(_vllm_hashes(tokens, 4, "xxhash"))[0] == [[]]
        c.free(ids)


def _request(hashes, ntok, session_id=None):
    """What BlockPool.cache_full_blocks reads of a vLLM Request."""
    return SimpleNamespace(block_hashes=hashes, all_token_ids=list(range(ntok)),
                           lora_request=None, mm_features=[], cache_salt=None,
                           session_id=session_id, prompt_embeds=None)


def _drain(pool):
    """Allocates every free block: the free queue's order, head first."""
    n = pool.get_num_free_blocks()
    return [b.block_id for b in pool.get_new_blocks(n)]


def test_free_order_is_vllms_test_prefill(daemon):
    url = daemon("name=f,blocks=11,block_size=4,executor=none")
    hashes = [bytes([i]) * 32 for i in range(1, 4)]
    theirs = BlockPool(11, True, 4)
    with kvpool.Client(url, pool="f") as c:
        ours = RemoteBlockPool(c)
        for pool in (theirs, ours):
            blocks = pool.get_new_blocks(5)
            pool.cache_full_blocks(_request(hashes, 20), blocks, 0, 3, 4, 0)
            pool.free_blocks(reversed(blocks))
        want = [b.block_id for b in theirs.free_block_queue.get_all_free_blocks()]
        assert want == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]  # vLLM's test_prefill
        # the read-only view, as vLLM's own tests read it, then by allocating
        assert [b.block_id for b in ours.free_block_queue.get_all_free_blocks()] == want
        assert _drain(ours) == want


@pytest.mark.parametrize("caching", [True, False])
def test_random_block_pool_runs_match_vllms(daemon, caching):
    """The same seeded run of allocations, caches and frees on vLLM's
    BlockPool and on a kvpool pool allocates the same ids throughout and
    leaves the same free queue."""
    seed = 20261127
    print(f"seed {seed}")
    rng = random.Random(seed)
    n = 24
    url = daemon(f"name=r,blocks={n},block_size=4,executor=none,caching={'on' if caching else 'off'}")
    theirs = BlockPool(n, caching, 4)
    with kvpool.Client(url, pool="r") as c:
        ours = RemoteBlockPool(c)
        held_t, held_o, serial = [], [], 0
        for step in range(300):
            op = rng.random()
            if op < 0.45 and theirs.get_num_free_blocks() > 0:
                k = rng.randint(1, min(4, theirs.get_num_free_blocks()))
                bt, bo = theirs.get_new_blocks(k), ours.get_new_blocks(k)
                assert [b.block_id for b in bt] == [b.block_id for b in bo], step
                if caching and rng.random() < 0.6:
                    m = rng.randint(1, k)
                    hashes = [(serial + i).to_bytes(32, "big") for i in range(m)]
                    serial += m
                    for pool, blocks in ((theirs, bt), (ours, bo)):
                        pool.cache_full_blocks(_request(hashes, 4 * m), blocks, 0, m, 4, 0)
                held_t.append(bt)
                held_o.append(bo)
            elif held_t:
                i = rng.randrange(len(held_t))
                bt, bo = held_t.pop(i), held_o.pop(i)
                theirs.free_blocks(reversed(bt))
                ours.free_blocks(reversed(bo))
        for bt, bo in zip(held_t, held_o):
            theirs.free_blocks(reversed(bt))
            ours.free_blocks(reversed(bo))
        want = [b.block_id for b in theirs.free_block_queue.get_all_free_blocks()]
        assert [b.block_id for b in ours.free_block_queue.get_all_free_blocks()] == want
        # the prefix-cache map's keys, iterated as vLLM's tests read its map
        assert set(ours.cached_block_hash_to_block) == set(theirs.cached_block_hash_to_block._cache)
        assert _drain(ours) == want


def test_free_queue_view_pages_and_refuses_a_moved_cursor(daemon):
    """Client.free_queue reads the queue a page at a time; a page after a
    block that is no longer free is refused NOT_FOUND (the walk restarts)."""
    url = daemon("name=fq,blocks=40,block_size=4,executor=none")
    with kvpool.Client(url, pool="fq") as c:
        ids = c.allocate(10)
        c.free(ids)
        whole = c.free_queue()
        assert len(whole) == 39 and c.free_queue(page=3) == whole
        got = c.allocate(1)  # the head leaves the queue
        from ctypes import byref, c_bool, c_int32, c_size_t
        buf, n, more = (c_int32 * 4)(), c_size_t(), c_bool()
        rv = kvpool._lib.kvp_client_free_queue(c._live(), got[0], buf, 4, byref(n), byref(more))
        assert rv == kvpool.NotFound.status
        assert c.free_queue() == whole[1:]
        c.free(got)


def test_coarse_blocks_are_keyed_as_vllms(daemon):
    """A group of 8-token blocks over 4-token hashes: vLLM 0.33 keys block i
    by BlockHashListWithBlockSize(fine, 4, 8)[i], the last fine hash."""
    url = daemon("name=c,blocks=8,hash_block_size=4,groups=full:8,executor=none")
    tokens = list(range(16))
    fine = _vllm_hashes(tokens, 4)
    coarse = vku.BlockHashListWithBlockSize(fine, 4, 8)
    with kvpool.Client(url, pool="c") as c:
        pool = RemoteBlockPool(c)
        blocks = pool.get_new_blocks(2)
        pool.cache_full_blocks(_request(fine, 16), blocks, 0, 2, 8, 0)
        for i, b in enumerate(blocks):
            assert b.block_hash == vku.make_block_hash_with_group_id(coarse[i], 0)
            assert [x.block_id for x in pool.get_cached_block(coarse[i], [0])] == [b.block_id]
        pool.free_blocks(reversed(blocks))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_wire_decodes_with_vllms_own_classes(daemon):
    """kvpoold's vLLM wire (map form, vLLM 0.26 on) decoded by vLLM 0.33's
    KVEventBatch: a pool without an executor says medium GPU, as the engine
    block pool it stands for; the request's session_id rides on its
    BlockStored."""
    port = _free_port()
    wire = f"tcp://127.0.0.1:{port}"
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(wire)
    try:
        url = daemon("name=w,blocks=16,block_size=4,executor=none",
                     extra=("--vllm-events", f"tcp://*:{port}"))
        time.sleep(0.3)
        tokens = list(range(500, 508))
        want = _vllm_hashes(tokens, 4)
        with kvpool.Client(url, pool="w") as c:
            ids = c.allocate(2)
            c.cache(ids, tokens, 2, session_id="chat-7")
            c.free(ids)
            c.evict(ids)
        dec = msgspec.msgpack.Decoder(type=vke.KVEventBatch)
        events, deadline = [], time.monotonic() + 10
        while len(events) < 3 and time.monotonic() < deadline:
            if sub.poll(100):
                _topic, _seq, payload = sub.recv_multipart()
                events += dec.decode(payload).events
        stored, *removed = events
        assert isinstance(stored, vke.BlockStored)
        assert stored.block_hashes == [vku.maybe_convert_block_hash(h) for h in want]
        assert stored.parent_block_hash is None and stored.token_ids == tokens
        assert stored.block_size == 4 and stored.medium == vke.MEDIUM_GPU
        assert stored.group_idx == 0 and stored.session_id == "chat-7"
        assert all(isinstance(e, vke.BlockRemoved) and e.medium == "GPU" for e in removed)
        assert sorted(h for e in removed for h in e.block_hashes) == sorted(
            stored.block_hashes)
    finally:
        sub.close(0)
        ctx.term()


def _array_twin(cls):
    """vLLM 0.33's event class with the array layout vLLM used before 0.26
    (array_like): the same fields, types and defaults, read positionally."""
    fields = [(f.name, f.type) if f.default is msgspec.NODEFAULT else (f.name, f.type, f.default)
              for f in msgspec.structs.fields(cls)]
    return msgspec.defstruct(cls.__name__, fields, array_like=True, omit_defaults=True,
                             tag=True, kw_only=False)


def test_vllm_wire_array_form_decodes_with_vllms_fields(daemon):
    """--vllm-format array (vLLM before 0.26): each event is [tag, fields...]
    in vLLM's field order, a session_id after locality and ownership (None);
    decoded with twins of vLLM 0.33's own classes."""
    port = _free_port()
    stored_t, removed_t, cleared_t = (_array_twin(c) for c in
                                      (vke.BlockStored, vke.BlockRemoved, vke.AllBlocksCleared))
    batch_t = msgspec.defstruct("KVEventBatch", [("ts", float),
                                                  ("events", list[stored_t | removed_t | cleared_t]),
                                                  ("data_parallel_rank", int | None, None)],
                                array_like=True, omit_defaults=True)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    try:
        url = daemon("name=a,blocks=16,block_size=4,executor=none",
                     extra=("--vllm-events", f"tcp://*:{port}", "--vllm-format", "array"))
        time.sleep(0.3)
        tokens = list(range(40, 48))
        with kvpool.Client(url, pool="a") as c:
            ids = c.allocate(2)
            c.cache(ids, tokens[:4], 1)
            c.cache(ids, tokens, 2, num_cached_blocks=1, session_id="s-2")
            c.free(ids)
            c.evict(ids)
        dec = msgspec.msgpack.Decoder(type=batch_t)
        events, deadline = [], time.monotonic() + 10
        while len(events) < 4 and time.monotonic() < deadline:
            if sub.poll(100):
                _topic, _seq, payload = sub.recv_multipart()
                events += dec.decode(payload).events
        first, second = events[:2]
        assert isinstance(first, stored_t) and isinstance(second, stored_t)
        assert first.block_hashes + second.block_hashes == [
            vku.maybe_convert_block_hash(h) for h in _vllm_hashes(tokens, 4)]
        assert first.token_ids == tokens[:4] and second.token_ids == tokens[4:]
        assert first.block_size == 4 and first.medium == "GPU"
        assert first.session_id is None and second.session_id == "s-2"
        assert second.locality is None and second.ownership is None
        assert all(isinstance(e, removed_t) for e in events[2:])
    finally:
        sub.close(0)
        ctx.term()


@pytest.mark.parametrize("form", ["map", "array"])
def test_cluster_blocks_decode_as_remote_with_vllms_own_classes(daemon, tmp_path, form):
    """The cluster tier's announcements (ClusterFill's stored and removed
    keys, docs/cluster.md "Events"): BlockStored and BlockRemoved of medium
    CLUSTER with locality REMOTE, vLLM 0.33's word for a tier across the
    network, decoded by vLLM's own classes (map) or their twins (array),
    under the pod topic of each engine session on the node."""
    port = _free_port()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    if form == "map":
        dec = msgspec.msgpack.Decoder(type=vke.KVEventBatch)
        stored_t, removed_t = vke.BlockStored, vke.BlockRemoved
    else:
        stored_t, removed_t = (_array_twin(c) for c in (vke.BlockStored, vke.BlockRemoved))
        dec = msgspec.msgpack.Decoder(type=msgspec.defstruct(
            "KVEventBatch", [("ts", float), ("events", list[stored_t | removed_t]),
                             ("data_parallel_rank", int | None, None)],
            array_like=True, omit_defaults=True))
    try:
        url = daemon("name=t,blocks=16,block_size=16,executor=cpu,cluster_wait_ms=500",
                     extra=("--vllm-events", f"tcp://*:{port}", "--vllm-format", form,
                            "--vllm-pod", "node-a", "--region-dir", str(tmp_path)))
        time.sleep(0.3)
        keys = [kvpool.offload_key(bytes([i]) * 32, 0) for i in (1, 2, 3)]
        with kvpool.Client(url, pool="t", vllm_pod="10.9.0.7") as engine, \
                kvpool.Client(url, pool="t") as agent:
            agent.cluster_announce(stored=keys)
            agent.cluster_announce(removed=keys[:1])
            with pytest.raises(ValueError):  # refused before it is sent
                agent.cluster_announce(stored=[b"short"])
            got, deadline = [], time.monotonic() + 10
            while len(got) < 4 and time.monotonic() < deadline:
                if sub.poll(100):
                    topic, _seq, payload = sub.recv_multipart()
                    got += [(topic.decode(), e) for e in dec.decode(payload).events]
            assert engine.info["pool"] == "t"
        assert sorted({t for t, _ in got}) == ["kv@10.9.0.7@t", "kv@node-a@t"], got
        mine = [e for t, e in got if t == "kv@10.9.0.7@t"]
        assert [type(e) for e in mine] == [stored_t, removed_t], mine
        stored, removed = mine
        assert stored.block_hashes == [vku.maybe_convert_block_hash(k[:32]) for k in keys]
        assert stored.medium == "CLUSTER" and stored.locality == "REMOTE"
        assert stored.token_ids == [] and stored.block_size == 16 and stored.group_idx == 0
        assert removed.block_hashes == [vku.maybe_convert_block_hash(keys[0][:32])]
        assert removed.medium == "CLUSTER" and removed.locality == "REMOTE"
    finally:
        sub.close(0)
        ctx.term()


def test_block_pool_events_are_vllms_own(tmp_path, monkeypatch):
    """RemoteBlockPool.take_events() with vLLM installed: vLLM's own event
    classes, equal to what vLLM's BlockPool emits for the same calls,
    emit_cached_block_events' reuse report included."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    proc, url, ev = start(tmp_path, "--pool", "name=e,blocks=8,block_size=4,executor=none",
                          pool="e", events=True)
    try:
        tokens = list(range(70, 78))
        hashes = _vllm_hashes(tokens, 4)
        theirs = BlockPool(8, True, 4, enable_kv_cache_events=True)
        with kvpool.Client(url, pool="e") as c:
            ours = RemoteBlockPool(c, True, events_url=ev)
            try:
                for pool in (theirs, ours):
                    blocks = pool.get_new_blocks(2)
                    pool.cache_full_blocks(_request(hashes, 8, "chat-9"), blocks, 0, 2, 4, 0)
                    pool.emit_cached_block_events(_request(hashes, 8, "chat-10"), 2, 4, 0)
                    pool.free_blocks(reversed(blocks))
                    pool.evict_blocks({blocks[1].block_id})
                want, got = theirs.take_events(), ours.take_events()
            finally:
                ours.close()
        assert [type(e) for e in got] == [vke.BlockStored, vke.BlockStored, vke.BlockRemoved]
        assert got[0].session_id == "chat-9" and got[1].session_id == "chat-10"
        assert got == want
    finally:
        stop(proc)


def test_evictions_and_reuse_reports_follow_vllms_order(tmp_path, monkeypatch):
    """evict_blocks announces removals in the order of the set vLLM's caller
    passes (not sorted), and emit_cached_block_events names every hash it
    is given, cached or not (a sliding window's hit holds blocks that left
    the cache): the events equal vLLM's BlockPool's."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    proc, url, ev = start(tmp_path, "--pool", "name=o,blocks=16,block_size=4,executor=none",
                          pool="o", events=True)
    try:
        tokens = list(range(300, 340))
        hashes = _vllm_hashes(tokens, 4)
        theirs = BlockPool(16, True, 4, enable_kv_cache_events=True)
        with kvpool.Client(url, pool="o") as c:
            ours = RemoteBlockPool(c, True, events_url=ev)
            try:
                for pool in (theirs, ours):
                    blocks = pool.get_new_blocks(10)
                    pool.cache_full_blocks(_request(hashes, 40), blocks, 0, 10, 4, 0)
                    pool.free_blocks(reversed(blocks))
                    ids = {blocks[i].block_id for i in (8, 2, 4)}
                    assert list(ids) != sorted(ids)  # the set's own order
                    pool.evict_blocks(ids)
                    pool.emit_cached_block_events(_request(hashes, 40), 10, 4, 0)
                want, got = theirs.take_events(), ours.take_events()
            finally:
                ours.close()
        assert [type(e) for e in want][-4:] == [vke.BlockRemoved] * 3 + [vke.BlockStored]
        assert len(want[-1].block_hashes) == 10  # evicted ones too
        assert got == want
    finally:
        stop(proc)
