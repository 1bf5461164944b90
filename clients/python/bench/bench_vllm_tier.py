# SPDX-License-Identifier: Apache-2.0
"""kvpool as a secondary tier (kvpool.vllm_tier) against vLLM 0.33's own fs
tier on tmpfs, in one run, for the same chunks, through vLLM's
TieringOffloadingManager and its CPU primary tier:

  - store: engine A stores N chunks; the tiering manager cascades them into
    the secondary tier; the time until every store job has finished;
  - load: engine B (its own primary tier, the same secondary tier's backing)
    looks the N chunks up as vLLM's scheduler does, step after step, until
    each is promoted into its primary tier (a HIT); the time until the last;
  - scheduler cost: the scheduler thread's time in lookup() and
    on_schedule_end() during the load, per step.

Each repetition uses fresh keys; the two tiers run interleaved and the
medians are reported. Run with the environment tests/vllm/env.sh makes:

    $(sh tests/vllm/env.sh)/bin/python clients/python/bench/bench_vllm_tier.py \\
        [--quick] [BUILD_DIR]
"""
import os
import shutil
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "vllm033"))
sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))

from vllm.v1.kv_offload.base import (LookupResult, ReqContext, ScheduleEndContext,  # noqa: E402
                                     make_offload_key)
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager  # noqa: E402
from vllm.v1.kv_offload.tiering.manager import (CPUPrimaryTierOffloadingManager,  # noqa: E402
                                                TieringOffloadingManager)

import bench_json  # noqa: E402
import kvpool  # noqa: E402
from primary_region import PrimaryRegion  # noqa: E402
from kvpool.vllm_tier import KVPoolSecondaryTier  # noqa: E402

# A chunk of an 8-layer, 8-KV-head, head size 128, fp16 model, 16 tokens: 512 KiB.
LAYOUT = "block_size=16,layers=8,heads=8,head_size=128,dtype=fp16,shards=1"


def _fs_spec():
    """What vLLM's fs tier reads of an OffloadingSpec (its file names' namespace)."""
    parallel = SimpleNamespace(tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, rank=0,
                               is_parallelism_agnostic=True)
    config = SimpleNamespace(groups=(), canonical_layout=False, kv_cache_layout=None,
                             replicated_layout=False, parallel=parallel,
                             model=SimpleNamespace(name="bench", dtype="float16"),
                             cache=SimpleNamespace(tokens_per_hash=16))
    return SimpleNamespace(config=config, blocks_per_chunk=1,
                           kv_events_config=SimpleNamespace(enable_kv_cache_events=False))


class _Engine:
    def __init__(self, n, row_bytes, make_tier, name):
        self.region = PrimaryRegion(n, row_bytes)
        primary = CPUPrimaryTierOffloadingManager(n, self.region)
        self.tier = make_tier(primary.get_kv_memoryview())
        self.m = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[self.tier])
        self.ctx = ReqContext(req_id=name)
        self.m.on_new_request(self.ctx)
        self.sched_s = 0.0
        self.steps = 0

    def step(self):
        t = time.perf_counter()
        self.m.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
        list(self.m.take_events())
        self.sched_s += time.perf_counter() - t
        self.steps += 1

    def store(self, keys, data):
        out = self.m.prepare_store(keys, self.ctx)
        for c, d in zip(out.store_spec.chunk_ids, data):
            self.region.kv[c] = d
        t0 = time.perf_counter()
        self.m.complete_store(keys, self.ctx, success=True)
        while True:
            self.step()
            if not self.tier.has_pending_work() and not self.m._transfer_jobs:
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > 60:
                raise RuntimeError(f"{type(self.tier).__name__}: stores not done in 60 s")
            time.sleep(0.0002)

    def load(self, keys):
        t0 = time.perf_counter()
        self.sched_s, self.steps = 0.0, 0
        left = list(keys)
        while left:
            if time.perf_counter() - t0 > 60:
                raise RuntimeError(f"{type(self.tier).__name__}: {len(left)} chunks not "
                                   "promoted in 60 s")
            t = time.perf_counter()
            left = [k for k in left if self.m.lookup(k, self.ctx) is not LookupResult.HIT]
            self.sched_s += time.perf_counter() - t
            if left:
                self.step()
                time.sleep(0.0002)
        return time.perf_counter() - t0

    def read(self, key):
        spec = self.m.prepare_load([key], self.ctx)
        data = self.region.kv[spec.chunk_ids[0]].copy()
        self.m.complete_load([key], self.ctx)
        return data

    def close(self):
        self.m.shutdown()


def main(argv):
    quick = "--quick" in argv
    args = [a for a in argv[1:] if not a.startswith("--")]
    build = os.path.abspath(args[0] if args else os.path.join(ROOT, "build"))
    os.environ.setdefault("KVPOOLD", os.path.join(build, "service", "kvpoold"))
    os.environ.setdefault("KVPOOL_LIB", os.path.join(build, "clients", "c", "libkvpool.so"))
    from conftest import start, stop
    n, reps = (16, 1) if quick else (64, 5)
    work = tempfile.mkdtemp(prefix="kvp-bench-tier-")
    fs_root = tempfile.mkdtemp(prefix="kvp-bench-fs-", dir="/dev/shm")
    proc, url, _ = start(work, "--pool", f"name=t,executor=cpu,blocks={4 * n},{LAYOUT}",
                         pool="t")
    try:
        with kvpool.Client(url, pool="t") as c, c.region() as r:
            row_bytes = r.row_bytes
        rng = np.random.default_rng(20261129)
        data = [rng.integers(0, 256, row_bytes, dtype=np.uint8) for _ in range(n)]

        def kvpool_tier(view):
            return KVPoolSecondaryTier(None, view, "KVPoolSecondaryTier", kvpool_url=url,
                                       kvpool_pool="t")

        def fs_tier(view):
            return FileSystemTierManager(_fs_spec(), view, "fs", root_dir=fs_root)
        figures = {"kvpool": [], "fs": []}
        serial = 0
        for rep in range(reps):
            for name, make in (("kvpool", kvpool_tier), ("fs", fs_tier)):
                keys = [make_offload_key((serial + i).to_bytes(32, "big"), 0) for i in range(n)]
                serial += n
                a = _Engine(n, row_bytes, make, "a")
                b = _Engine(n, row_bytes, make, "b")
                try:
                    t_store = a.store(keys, data)
                    t_load = b.load(keys)
                    for i in (0, n - 1):  # the bytes, or the figure means nothing
                        assert np.array_equal(b.read(keys[i]), data[i]), (name, i)
                    figures[name].append((t_store, t_load, b.sched_s / max(b.steps, 1)))
                finally:
                    a.close()
                    b.close()
        mb = n * row_bytes / 1e6
        med = {k: [statistics.median(x[i] for x in v) for i in range(3)]
               for k, v in figures.items()}
        print(f"{n} chunks of {row_bytes} B, {reps} repetition(s), medians")
        print(f"{'tier':8} {'store MB/s':>11} {'load MB/s':>10} {'sched µs/step':>14}")
        for k, (ts, tl, sc) in med.items():
            print(f"{k:8} {mb / ts:11.0f} {mb / tl:10.0f} {sc * 1e6:14.0f}")
        (ks, kl, kc), (fs_, fl, fc) = med["kvpool"], med["fs"]
        base = "vLLM 0.33's fs tier on tmpfs, the same chunks"
        what = f"{n} chunks of {row_bytes // 1024} KiB"
        bench_json.record("tier", f"store: engine A's chunks cascaded to the tier ({what})",
                          mb / ks, "MB/s", base, mb / fs_, "higher")
        bench_json.record("tier", f"load: engine B's lookups to every chunk promoted ({what})",
                          mb / kl, "MB/s", base, mb / fl, "higher")
        bench_json.record("tier", "scheduler thread per step during the load (lookup and "
                          "on_schedule_end)", kc * 1e6, "µs per step", base, fc * 1e6, "lower")
        for k, (ts, tl, sc) in med.items():
            print(f"{k}: store {ts * 1e3:.1f} ms, load {tl * 1e3:.1f} ms")
    finally:
        stop(proc)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(fs_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
