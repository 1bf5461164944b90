# SPDX-License-Identifier: Apache-2.0
"""Pools that hash with vLLM's xxhash and xxhash_cbor (16-byte XXH3-128 hashes),
end to end against a real kvpoold: the daemon's hashes are the client's (and so
vLLM's: tests/test_block_hash.c holds vLLM's vectors), coarse keys join 16-byte
hashes, and both event streams carry 16-byte hashes."""
import time

import msgpack
import pytest
import zmq

import kvpool
from kvpool.events import BlockStored, EventBatch
from kvpool.vllm import RemoteBlockPool

from conftest import start, stop


X = "name=x,blocks=32,block_size=4,seed=0,executor=none,hash_algo=xxhash"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    proc, url, _ = start(tmp_path_factory.mktemp("kvpoold-xxhash"), "--pool", X,
                         "--pool", "name=xc,blocks=32,seed=0,executor=none,"
                                   "hash_algo=xxhash_cbor,groups=full:8,hash_block_size=4",
                         pool="x")
    yield url
    stop(proc)


def test_the_daemon_hashes_as_the_client_and_refuses_32_byte_hashes(served):
    url = served
    with kvpool.Client(url, pool="x") as c:
        assert (c.info["hash_algorithm"], c.info["hash_len"]) == ("xxhash", 16)
        mine = kvpool.Hasher("0", algorithm="xxhash").hash_request(range(12), 4)
        assert [len(h) for h in mine] == [16] * 3
        ids = c.allocate(3)
        assert c.cache(ids, range(12), 3) == 3          # the daemon hashes the tokens
        assert c.lookup_hashes(mine)[0] == [ids]        # ... to the client's hashes
        assert c.lookup(range(12)) == (ids, 12)
        with pytest.raises(ValueError):
            c.lookup_hashes([h + h for h in mine])      # SHA-256-sized: not this pool's
        c.free(ids)


def test_coarse_blocks_are_keyed_by_their_last_16_byte_hash(served):
    """vLLM 0.33: a coarse block's key is its last fine hash (one digest)."""
    url = served
    with kvpool.Client(url, pool="xc") as c:
        assert c.info["hash_len"] == 16 and c.info["max_hash_len"] == 16
        fine = kvpool.Hasher("0", algorithm="xxhash_cbor").hash_request(range(16), 4)
        ids = c.allocate(2)
        assert c.cache_hashes(ids, fine, 0, 2, block_size=8, tokens=range(16)) == 2
        assert c.lookup_hashes(fine, block_size=8)[0] == [ids]
        pool = RemoteBlockPool(c)
        got = pool.get_cached_block(fine[3], [0])
        assert [b.block_id for b in got] == [ids[1]]
        assert got[0].block_hash == fine[3] + b"\0\0\0\0"
        assert pool.get_cached_block(fine[2], [0]) is None
        c.free(ids)


def _wire_events(sock, want, deadline):
    """vLLM-wire BlockStored events until want of them arrived."""
    out = []
    while len(out) < want and time.monotonic() < deadline:
        if not sock.poll(100):
            continue
        _topic, _seq, payload = sock.recv_multipart()
        _ts, events, _rank = msgpack.unpackb(payload)
        out += [e for e in events if e["type"] == "BlockStored"]
    return out


def test_both_event_streams_carry_16_byte_hashes(tmp_path):
    wire = f"ipc://{tmp_path}/vllm.ipc"
    proc, url, ev = start(tmp_path, "--vllm-events", wire, "--vllm-hashes", "bytes",
                          "--pool", X, pool="x", events=True)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(wire)
    try:
        with kvpool.Client(url, pool="x") as c, \
                kvpool.Subscriber(ev, url, pools=["x"]) as sub:
            time.sleep(0.3)  # the SUB socket's subscription reaches the daemon
            toks = range(100, 108)
            mine = kvpool.Hasher("0", algorithm="xxhash").hash_request(toks, 4)
            ids = c.allocate(2)
            c.cache(ids, toks, 2)
            c.free(ids)
            deadline = time.monotonic() + 10
            stored = []
            while not stored and time.monotonic() < deadline:
                for b in sub.poll(50):
                    if isinstance(b, EventBatch):
                        stored += [e for e in b.events if isinstance(e, BlockStored)]
            assert stored, "no BlockStored on kvpool's stream"
            assert stored[0].block_hashes == [int.from_bytes(h[-8:], "big") for h in mine]
            vw = _wire_events(sock, 1, deadline)
            assert vw, "no BlockStored on the vLLM wire"
            assert vw[0]["block_hashes"] == mine and vw[0]["parent_block_hash"] is None
    finally:
        sock.close(0)
        ctx.term()
        stop(proc)
