# SPDX-License-Identifier: Apache-2.0
"""The Python subscriber and index, the Batch builder, WriteTokens, and a
killed Python client's blocks, against a real kvpoold."""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import kvpool
from kvpool.events import BlockStored, EventBatch, Reset

from conftest import start, stop

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    proc, url, ev = start(tmp_path_factory.mktemp("kvpoold-stream"),
                          "--lease-ms", "2000", "--kv-layers", "2", "--kv-heads", "2",
                          "--kv-head-size", "8",
                          "--pool", "name=kv,blocks=64,block_size=4,seed=0",
                          "--pool", "name=sealed,blocks=16,block_size=4,seed=0,executor=none,"
                                    "token_file=" + _token(tmp_path_factory),
                          pool="kv", events=True)
    yield url, ev
    stop(proc)


def _token(tmp_path_factory):
    p = tmp_path_factory.mktemp("tok") / "token"
    p.write_text("s3cret\n")
    os.chmod(p, 0o600)
    return str(p)


def test_subscriber_index_follows_a_random_workload(served):
    url, ev = served
    rng = random.Random(7)
    with kvpool.Client(url, pool="kv") as c, \
            kvpool.Subscriber(ev, url, pools=["kv"]) as sub:
        first = sub.poll(0)
        assert isinstance(first[0], Reset) and first[0].pool == "kv"
        held = []
        for step in range(300):
            op = rng.random()
            if op < 0.45 and len(held) < 40:
                n = rng.randint(1, 4)
                try:
                    ids = c.allocate(n)
                except kvpool.NoSpace:
                    continue
                base = rng.randint(0, 6) * 4  # shared prefixes: duplicates and hits
                c.cache(ids, range(base, base + 4 * n), n)
                held.append(ids)
            elif held:
                c.free(held.pop(rng.randrange(len(held))))
            if step % 50 == 0 and not held:
                c.reset()  # AllBlocksCleared in the stream
        for ids in held:
            c.free(ids)
        epoch, target = c.event_position()
        got = []
        deadline = time.monotonic() + 10
        while sub.stats("kv")["next_seq"] < target:
            got += sub.poll(50)
            assert time.monotonic() < deadline, "the subscriber did not catch up"
        assert any(isinstance(b, EventBatch) and any(isinstance(e, BlockStored) for e in b.events)
                   for b in got)
        s_epoch, s_next, entries = c.snapshot()
        assert s_epoch == epoch and s_next == target
        assert len(sub.index) == len(entries) and sub.index.equals(entries)
        assert sub.index.diverged == 0
        h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"]).hash_request(range(8), 4)
        expect = 0
        while expect < len(h) and (h[expect], 0) in entries:
            expect += 1
        assert sub.index.prefix(h) == expect


def test_subscriber_of_a_sealed_pool_needs_its_token(served):
    url, ev = served
    with pytest.raises(kvpool.Unauthenticated):
        kvpool.Subscriber(ev, url, pools=["sealed"])
    with kvpool.Client(url, pool="sealed", token="s3cret") as c, \
            kvpool.Subscriber(ev, url, pools=["sealed"], token="s3cret") as sub:
        sub.poll(0)
        ids = c.allocate(2)
        c.cache(ids, range(8), 2)
        _, target = c.event_position()
        got = []
        deadline = time.monotonic() + 10
        while sub.stats("sealed")["next_seq"] < target and time.monotonic() < deadline:
            got += sub.poll(50)
        stored = [e for b in got if isinstance(b, EventBatch) for e in b.events]
        assert stored and stored[-1].token_ids == list(range(8))  # unsealed with the key
        c.free(ids)


def test_batch_builder_runs_a_step(served):
    url, _ = served
    with kvpool.Client(url, pool="kv") as c:
        free0 = c.stats()["num_free"]
        with c.batch(keep_going=True) as b:
            i_alloc = b.allocate(3)
            b.allocate_slots(1, prompt=range(5000, 5009))  # no prefix cached
            b.allocate(10_000)  # refused alone
            b.stats()
            res = b.send()
            assert res[i_alloc].ok and len(res[i_alloc].block_ids) == 3
            assert res[1].slots.num_computed_tokens == 9 and len(res[1].slots.new_blocks) == 3
            assert isinstance(res[2].error, kvpool.NoSpace) and res[2].error.detail
            assert res[3].stats["num_free"] == free0 - 6
            b.clear()
            b.free(res[i_alloc].block_ids)
            b.free_request(1)
            assert [r.ok for r in b.send()] == [True, True]
        with kvpool.Client(url, pool="kv") as other:
            theirs = other.allocate(1)
            with c.batch() as b:
                b.allocate(1)
                b.free(theirs)  # not held by c: stops the batch, send() raises it
                b.allocate(1)
                with pytest.raises(kvpool.NotOwner) as e:
                    b.send()
                assert e.value.results[2].status == kvpool.NotFound.status  # did not run
                c.free(e.value.results[0].block_ids)
            other.free(theirs)
        assert c.stats()["num_free"] == free0


def test_write_tokens_places_k_and_v_by_slot(served):
    np = pytest.importorskip("numpy")
    url, _ = served
    with kvpool.Client(url, pool="kv") as c:
        ex = c.info["executor"]
        assert ex["layout"] == "nhd" and ex["dtype"] == "fp16"
        layers, heads, hs, bs = ex["num_layers"], ex["num_heads"], ex["head_size"], 4
        (blk,) = c.allocate(1)
        c.write_blocks([blk], bytes(ex["block_bytes"]))
        k = np.arange(layers * 2 * heads * hs, dtype=np.float16).reshape(layers, 2, heads, hs)
        v = -k
        c.write_tokens([blk * bs + 1, -1], k, v)  # token 2 is skipped
        out = np.zeros(ex["block_bytes"] // 2, dtype=np.float16)
        c.read_blocks([blk], out)
        chunk = out.reshape(layers, 2, bs, heads, hs)  # [layer][K,V][token][head][dim]
        for layer in range(layers):
            assert np.array_equal(chunk[layer, 0, 1], k[layer, 0])
            assert np.array_equal(chunk[layer, 1, 1], v[layer, 0])
            assert not chunk[layer, :, (0, 2, 3)].any()
        with pytest.raises(ValueError):
            c.write_tokens([blk * bs], k, v[:1])
        c.free([blk])


def test_killed_python_client_blocks_come_back_after_its_lease(served):
    url, _ = served
    with kvpool.Client(url, pool="kv") as c:
        free0 = c.stats()["num_free"]
        child = subprocess.Popen(
            [sys.executable, "-c",
             "import sys, time; sys.path.insert(0, sys.argv[2]); import kvpool\n"
             "c = kvpool.Client(sys.argv[1], pool='kv', lease_ms=500)\n"
             "c.allocate(5); print('held', flush=True); time.sleep(60)", url,
             os.path.dirname(HERE)], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "held"
        assert c.stats()["num_free"] == free0 - 5
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        deadline = time.monotonic() + 10
        while c.stats()["num_free"] != free0:
            assert time.monotonic() < deadline, "the dead client's blocks were not released"
            time.sleep(0.1)
            c.heartbeat()
        assert c.stats()["leases_expired"] >= 1


def test_subscriber_follows_a_restarted_daemon(tmp_path):
    """A Subscriber left open while kvpoold restarts on the same endpoints:
    its session is gone (the new daemon refuses it once), it opens a new
    one, resets to the new epoch and delivers the new daemon's batches."""
    args = ("--pool", "name=s,blocks=32,block_size=4,executor=none")
    proc, url, ev = start(tmp_path, *args, pool="s", events=True)

    def produce(k):
        with kvpool.Client(url, pool="s") as c:
            ids = c.allocate(1)
            c.cache(ids, range(4 * k, 4 * k + 4), 1)
            c.free(ids)

    def batches(sub, timeout_s):
        got, end = [], time.monotonic() + timeout_s
        while time.monotonic() < end and not any(isinstance(x, kvpool.EventBatch) for x in got):
            got += sub.poll(50)
        return got

    sub = kvpool.Subscriber(ev, url, pools=["s"], index=False)
    try:
        time.sleep(0.3)  # the subscription reaches the publisher
        produce(0)
        before = batches(sub, 5)
        epoch0 = [x for x in before if isinstance(x, kvpool.EventBatch)][0].epoch
        stop(proc)
        proc, url2, ev2 = start(tmp_path, *args, pool="s", events=True)
        assert (url2, ev2) == (url, ev)
        after = []
        for k in range(1, 40):  # the SUB socket reconnects at a time of its own
            produce(k)
            after += batches(sub, 0.25)
            if any(isinstance(x, kvpool.EventBatch) for x in after):
                break
        resets = [x for x in after if isinstance(x, kvpool.Reset)]
        got = [x for x in after if isinstance(x, kvpool.EventBatch)]
        assert resets and resets[0].epoch != epoch0, after
        assert got and got[0].epoch == resets[0].epoch, after
    finally:
        sub.close()
        stop(proc)


def test_subscriber_fileno_wakes_an_event_loop(served):
    """select() on fileno() wakes when stream messages wait, and poll(0) then
    delivers them; an asyncio reader on it does the same. (The stream's
    once-a-second ticks wake it too: each wait collects until the event.)"""
    import asyncio
    import select
    url, ev = served

    def events_of(batches):
        return [e for b in batches if hasattr(b, "events") for e in b.events]

    with kvpool.Client(url, pool="kv") as c, kvpool.Subscriber(ev, url, pools=["kv"]) as sub:
        sub.poll(0)  # the snapshot's Reset
        fd = sub.fileno()
        ids = c.allocate(1)
        c.cache(ids, range(900, 904), 1)
        seen, deadline, woke = [], time.monotonic() + 10, 0
        while not any(isinstance(e, kvpool.BlockStored) for e in seen):
            assert time.monotonic() < deadline, "no BlockStored reached the loop"
            woke += len(select.select([fd], [], [], 1)[0])
            seen += events_of(sub.poll(0))
        assert woke > 0  # the descriptor, not the timeout, said there was something

        async def wait_removed():
            loop = asyncio.get_running_loop()
            got = []
            c.free(ids)
            c.evict(ids)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if any(isinstance(e, kvpool.BlockRemoved) for e in got):
                    return got
                ready = asyncio.Event()
                loop.add_reader(fd, ready.set)
                try:
                    await asyncio.wait_for(ready.wait(), 5)
                finally:
                    loop.remove_reader(fd)
                got += events_of(sub.poll(0))
            return got
        assert any(isinstance(e, kvpool.BlockRemoved) for e in asyncio.run(wait_removed()))
