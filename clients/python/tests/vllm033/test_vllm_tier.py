# SPDX-License-Identifier: Apache-2.0
"""kvpool as a secondary tier under vLLM 0.33's own tiering: vLLM's
TieringOffloadingManager with its CPU primary tier (CPUPrimaryTierOffloadingManager)
over KVPoolSecondaryTier, loaded by vLLM's SecondaryTierFactory from a tier
config alone, on a real kvpoold. Two such engines share the tier: a chunk
one spilled is promoted into the other's primary tier with its bytes, and a
chunk the primary tier evicted comes back from the tier."""
import os
import sys
import time

import numpy as np
import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"these tests pin vLLM 0.33, not {vllm.__version__}", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from vllm.v1.kv_offload.base import (LookupResult, ReqContext, ScheduleEndContext,  # noqa: E402
                                     make_offload_key)
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.manager import (CPUPrimaryTierOffloadingManager,  # noqa: E402
                                                TieringOffloadingManager)

import kvpool  # noqa: E402
from kvpool.vllm_tier import KVPoolSecondaryTier  # noqa: E402

from conftest import start, stop  # noqa: E402
from primary_region import PrimaryRegion  # noqa: E402

PRIMARY_CHUNKS = 4
RECOVER_S = 6.0  # the tier's longest backoff (5 s) and a step


class _Engine:
    """One engine's tiering manager: its private primary tier over our tier."""

    def __init__(self, url, row_bytes, name, spec=None, **extra):
        self.region = PrimaryRegion(PRIMARY_CHUNKS, row_bytes)
        primary = CPUPrimaryTierOffloadingManager(PRIMARY_CHUNKS, self.region)
        tier = SecondaryTierFactory.create_secondary_tier(
            {"type": "KVPoolSecondaryTier", "module_path": "kvpool.vllm_tier",
             "kvpool_url": url, "kvpool_pool": "t", **extra},
            primary.get_kv_memoryview(), spec)
        assert isinstance(tier, KVPoolSecondaryTier)
        self.tier = tier
        self.m = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier])
        self.ctx = ReqContext(req_id=name)
        self.m.on_new_request(self.ctx)
        self.events = []

    def step(self):
        self.m.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
        self.events += self.m.take_events()

    def put(self, keys, payloads):
        """Stores the keys prepare_store takes into the primary tier (as the
        GPU workers would write the chunks); the tiering manager cascades
        them to ours at its next steps. The keys taken."""
        out = self.m.prepare_store(keys, self.ctx)
        if out is None:
            return []
        data = dict(zip(keys, payloads))
        for c, k in zip(out.store_spec.chunk_ids, out.keys_to_store):
            self.region.kv[c] = data[k]
        self.m.complete_store(keys, self.ctx, success=True)
        return list(out.keys_to_store)

    def store(self, keys, payloads):
        """put, every key taken, then steps until the tier has stored them."""
        assert self.put(keys, payloads) == list(keys)
        self.settle()

    def settle(self, deadline_s=5.0):
        """Steps until the tier has no job in flight."""
        end = time.monotonic() + deadline_s
        while True:
            self.step()
            if not self.tier.has_pending_work() or time.monotonic() > end:
                return

    def load(self, key, deadline_s=5.0):
        """Looks key up as vLLM's scheduler does (RETRY, HIT_PENDING: ask
        again next step) until HIT, then the primary tier's bytes."""
        end = time.monotonic() + deadline_s
        while True:
            r = self.m.lookup(key, self.ctx)
            if r is LookupResult.HIT:
                break
            assert r is not LookupResult.MISS, key
            assert time.monotonic() < end, f"no HIT for {key!r} ({r})"
            self.step()
            time.sleep(0.01)
        return self.loaded(key)

    def loaded(self, key):
        """After a HIT: the load prepared, copied and completed as vLLM's
        scheduler and worker do it; the bytes."""
        spec = self.m.prepare_load([key], self.ctx)
        data = self.region.kv[spec.chunk_ids[0]].copy()
        self.m.complete_load([key], self.ctx)
        return data

    def close(self):
        self.m.shutdown()


def _key(i):
    return make_offload_key(i.to_bytes(32, "big"), 0)


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    monkeypatch.delenv("KVPOOL_POOL", raising=False)
    proc, url, _ = start(tmp_path, "--pool", "name=t,executor=cpu,blocks=64,block_size=4,"
                         "layers=2,heads=1,head_size=8,dtype=fp32,shards=1", pool="t")
    with kvpool.Client(url, pool="t") as c:
        with c.region() as r:
            row_bytes = r.row_bytes
    yield url, row_bytes
    stop(proc)


def test_engines_share_chunks_through_the_tier(daemon):
    url, row_bytes = daemon
    rng = np.random.default_rng(20261129)
    payload = {i: rng.integers(0, 256, row_bytes, dtype=np.uint8) for i in range(8)}
    a = _Engine(url, row_bytes, "a")
    b = _Engine(url, row_bytes, "b")
    try:
        # Engine A spills chunks 0-1; engine B, which never computed them, loads them.
        a.store([_key(0), _key(1)], [payload[0], payload[1]])
        for i in (0, 1):
            assert np.array_equal(b.load(_key(i)), payload[i]), i
        # A's primary tier holds 4 chunks: storing 4 more evicts 0 and 1 from it,
        # and the tier refills them with their bytes.
        for i in range(2, 6):
            a.store([_key(i)], [payload[i]])
        assert a.m.primary_tier.lookup(_key(0), a.ctx) is LookupResult.MISS
        assert np.array_equal(a.load(_key(0)), payload[0])
        # A key nobody stored is a miss, not an error, once asked.
        b.m.lookup(_key(7), b.ctx)
        b.step()
        assert b.m.lookup(_key(7), b.ctx) is LookupResult.MISS
    finally:
        a.close()
        b.close()


def test_stored_chunks_are_reported_as_vllms_fs_tier_reports_them(daemon):
    """With enable_kv_events (and the engine's KV events on), each chunk the
    tier stored is an OffloadingEvent of its keys, medium CPU, not removed,
    with the tier's locality, as vLLM's fs tier reports its own; without
    it, none."""
    from types import SimpleNamespace

    from vllm.v1.kv_offload.base import Locality, Medium
    url, row_bytes = daemon
    on = SimpleNamespace(kv_events_config=SimpleNamespace(enable_kv_cache_events=True))
    a = _Engine(url, row_bytes, "a", spec=on, enable_kv_events=True, locality="LOCAL")
    b = _Engine(url, row_bytes, "b", spec=on, locality="LOCAL")
    try:
        keys = [_key(40), _key(41)]
        a.store(keys, [np.full(row_bytes, 1, np.uint8), np.full(row_bytes, 2, np.uint8)])
        mine = [e for e in a.events if e.medium is Medium.CPU and not e.removed and
                e.locality is not None]
        assert [k for e in mine for k in e.keys] == keys, a.events
        assert all(e.locality is Locality.LOCAL for e in mine)
        b.store([_key(42)], [np.full(row_bytes, 3, np.uint8)])
        assert not [e for e in b.events if e.locality is not None], b.events
    finally:
        a.close()
        b.close()


def test_a_tier_whose_rows_are_not_the_chunks_is_refused(daemon):
    url, row_bytes = daemon
    region = PrimaryRegion(PRIMARY_CHUNKS, row_bytes + 8)
    with pytest.raises(ValueError, match=f"rows of {row_bytes} bytes"):
        KVPoolSecondaryTier(None, region.create_kv_memoryview(), "KVPoolSecondaryTier",
                            kvpool_url=url, kvpool_pool="t")
    with pytest.raises(ValueError, match="unknown settings"):
        KVPoolSecondaryTier(None, region.create_kv_memoryview(), "KVPoolSecondaryTier",
                            kvpool_url=url, kvpool_pool="t", poool="x")


def test_a_restart_never_loads_the_old_lifes_bytes(tmp_path, monkeypatch):
    """kvpoold is killed and started again under two engines. A chunk stored
    in the new life is loaded by the engine whose session and mapping were
    the old life's, with its bytes: the row the new session hands out is
    the new region's (the same row number held other bytes in the old one);
    what the old life held is a miss."""
    monkeypatch.delenv("KVPOOL_POOL", raising=False)
    args = ("--pool", "name=t,executor=cpu,blocks=64,block_size=4,layers=2,heads=1,"
            "head_size=8,dtype=fp32,shards=1")
    proc, url, _ = start(tmp_path, *args, pool="t")
    a = b = None
    try:
        with kvpool.Client(url, pool="t") as c:
            with c.region() as r:
                row_bytes = r.row_bytes
        p0 = np.full(row_bytes, 7, dtype=np.uint8)
        p1 = np.arange(row_bytes, dtype=np.uint32).astype(np.uint8)
        a = _Engine(url, row_bytes, "a")
        b = _Engine(url, row_bytes, "b")
        a.store([_key(0)], [p0])
        assert np.array_equal(b.load(_key(0)), p0)
        proc.kill()
        proc.wait()
        proc, url2, _ = start(tmp_path, *args, pool="t")
        assert url2 == url
        a.store([_key(1)], [p1])
        assert np.array_equal(b.load(_key(1)), p1)
        # key 0 was the old life's: gone with it (b still has it in its primary tier).
        assert a.m.primary_tier.lookup(_key(0), a.ctx) is LookupResult.HIT
        c2 = _Engine(url, row_bytes, "c")
        try:
            c2.m.lookup(_key(0), c2.ctx)
            c2.step()
            assert c2.m.lookup(_key(0), c2.ctx) is LookupResult.MISS
        finally:
            c2.close()
    finally:
        for e in (a, b):
            if e is not None:
                e.close()
        stop(proc)


def _payload(i, row_bytes):
    """Key i's bytes: a function of i alone, so a wrong load shows."""
    return np.random.default_rng(i).integers(0, 256, row_bytes, dtype=np.uint8)


class _Timed:
    """A tiering manager whose every call (those vLLM's scheduler makes)
    is timed: the longest in .longest."""

    def __init__(self, m):
        self._m, self.longest = m, 0.0

    def __getattr__(self, name):
        fn = getattr(self._m, name)
        if not callable(fn):
            return fn

        def timed(*a, **kw):
            t0 = time.monotonic()
            try:
                out = fn(*a, **kw)
                return list(out) if name == "take_events" else out  # a generator: run it
            finally:
                self.longest = max(self.longest, time.monotonic() - t0)
        return timed


def test_stops_and_kills_of_kvpoold_never_stall_or_fail_a_step(tmp_path, monkeypatch):
    """Two engines store and load through the tier while kvpoold is stopped
    (SIGSTOP for 1.5 s) or killed and started again, at random moments
    between and during their copies, for eight rounds. No call of the
    scheduler's raises; none waits past kvpool_timeout_ms plus 200 ms;
    every chunk loaded has its own bytes; after each fault (its round runs
    4 s, kvpoold answering again within 1.5 s of its start and a little
    more) a chunk A stores is a hit for B within RECOVER_S. Without the
    renewal forgetting the old session's rows, a stop after a restart left
    B missing everything: its unlock of rows the old session had held
    failed every step."""
    import random
    import signal

    monkeypatch.delenv("KVPOOL_POOL", raising=False)
    args = ("--pool", "name=t,executor=cpu,blocks=64,block_size=16,layers=4,heads=2,"
            "head_size=64,dtype=fp32,shards=1")
    timeout_ms = 300
    proc, url, _ = start(tmp_path, *args, pool="t")
    a = b = None
    rnd = random.Random(20261129)
    faults = {"stop": 0, "kill": 0}
    try:
        with kvpool.Client(url, pool="t") as c:
            with c.region() as r:
                row_bytes = r.row_bytes
        a = _Engine(url, row_bytes, "a", kvpool_timeout_ms=timeout_ms)
        b = _Engine(url, row_bytes, "b", kvpool_timeout_ms=timeout_ms)
        a.m, b.m = _Timed(a.m), _Timed(b.m)
        loaded, recover = set(), []
        for rnd_i in range(8):
            keys = list(range(100 * (rnd_i + 1), 100 * (rnd_i + 1) + 4))
            fault = "kill" if rnd_i % 2 else "stop"
            at = rnd.uniform(0.0, 0.05)  # into A's stores, or B's lookups and loads
            assert a.put([_key(k) for k in keys], [_payload(k, row_bytes) for k in keys])
            t_fault = time.monotonic() + at
            faulted, cont_at = False, None
            end = time.monotonic() + 4.0
            while time.monotonic() < end:
                if not faulted and time.monotonic() >= t_fault:
                    faulted = True
                    faults[fault] += 1
                    if fault == "stop":
                        proc.send_signal(signal.SIGSTOP)
                        cont_at = time.monotonic() + 1.5
                    else:
                        proc.kill()
                        proc.wait()
                        proc, url2, _ = start(tmp_path, *args, pool="t")
                        assert url2 == url
                if cont_at is not None and time.monotonic() >= cont_at:
                    proc.send_signal(signal.SIGCONT)
                    cont_at = None
                a.step()
                for k in keys:
                    if b.m.lookup(_key(k), b.ctx) is LookupResult.HIT:
                        assert np.array_equal(b.loaded(_key(k)), _payload(k, row_bytes)), \
                            (rnd_i, k)
                        loaded.add(k)
                b.step()
                time.sleep(0.01)
            if cont_at is not None:
                proc.send_signal(signal.SIGCONT)
            # After the fault: a chunk A stores now is soon a hit for B.
            back = time.monotonic()
            k = 100 * (rnd_i + 1) + 50
            while True:
                assert time.monotonic() - back < RECOVER_S, \
                    f"round {rnd_i} ({fault}): no hit {RECOVER_S} s into the check"
                a.put([_key(k)], [_payload(k, row_bytes)])
                a.settle(1.0)
                r = LookupResult.RETRY
                while r is not LookupResult.MISS and time.monotonic() - back < RECOVER_S:
                    r = b.m.lookup(_key(k), b.ctx)
                    if r is LookupResult.HIT:
                        break
                    b.step()
                    time.sleep(0.02)
                if r is LookupResult.HIT:
                    assert np.array_equal(b.loaded(_key(k)), _payload(k, row_bytes))
                    recover.append(time.monotonic() - back)
                    break
                k += 1  # its store was skipped (the tier still backing off): another
        longest = max(a.m.longest, b.m.longest)
        print(f"tier chaos: {faults['stop']} stops, {faults['kill']} kills; "
              f"{len(loaded)} of 32 chunks loaded by B during the rounds, all with their bytes; "
              f"a hit again after every fault ({max(recover):.2f} s at most into the check "
              f"after its round); "
              f"longest scheduler call {longest * 1000:.0f} ms (timeout {timeout_ms} ms)")
        assert longest < (timeout_ms + 200) / 1000
    finally:
        try:
            proc.send_signal(signal.SIGCONT)
        except Exception:
            pass
        for e in (a, b):
            if e is not None:
                e.close()
        stop(proc)
