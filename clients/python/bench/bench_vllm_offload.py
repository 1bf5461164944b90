# SPDX-License-Identifier: Apache-2.0
"""kvpool's offloading tier (kvpool.vllm_offload) against vLLM 0.33's own
CPU tier, in one run on this machine.

    VENV=$(sh tests/vllm/env.sh)
    $VENV/bin/python clients/python/bench/bench_vllm_offload.py [--quick] [BUILD_DIR]

1. The scheduler side: the same sequence of manager calls, as the
   OffloadingConnector makes them, into KVPoolOffloadingManager (a kvpoold
   over ipc://) and into vLLM's CPUOffloadingManager. Each step 1, 8 or 64
   requests arrive (one figure each), each 40 blocks (its first 24 shared with others: four system
   prompts), are looked up (vLLM's scan: stop at a miss, go on past RETRY;
   a request with a RETRY looks up again next step), load their hits and
   store the rest; the next step completes those loads and stores. Prints
   the median microseconds per step over rounds and the ratio kvpool /
   vLLM (the aim: 1.1 or less; one round trip a step at most).
2. The worker side: KVPoolOffloadingWorker storing and loading 64 blocks of
   2 MiB (32 layer tensors of 64 KiB pages, CPU tensors) through the
   region, against a raw torch copy of the same bytes between two tensors
   (the aim: 0.8 or more).
Machine-readable lines: `offload step_us arrivals A kvpool K vllm V ratio R` and
`offload store|load BYTES ratio_vs_copy R`."""
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))),
                                "tests", "bench"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches,  # noqa: E402
                                     CanonicalKVCacheTensor, GPULoadStoreSpec, LookupResult,
                                     ReqContext, make_offload_key)
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,  # noqa: E402
                                       OffloadingGroupConfig, OffloadingModelConfig,
                                       OffloadingParallelConfig)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

import kvpool  # noqa: E402
from kvpool.vllm_offload import (KVPoolOffloadingManager, KVPoolOffloadingWorker,  # noqa: E402
                                 KVPoolRowsSpec)
from conftest import start, stop  # noqa: E402
import bench_json  # noqa: E402

QUICK = "--quick" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--quick"]
if ARGS:
    os.environ["KVPOOLD"] = os.path.join(ARGS[0], "service", "kvpoold")
ROUNDS, STEPS = (2, 20) if QUICK else (5, 100)
ARRIVALS, BLOCKS, SHARED, PREFIXES, TIER = (1, 8, 64), 40, 24, 4, 8192
LAYERS, PAGE, NBLK = (4, 65536, 16) if QUICK else (32, 65536, 64)


def config(worker_bytes, rank=0):
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l",), group_id=0),),
        worker_kv_bytes_per_block=worker_bytes, enable_kv_cache_events=False,
        extra_config={}, engine_id="bench",
        model=OffloadingModelConfig(name="bench", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(rank=rank, world_size=1, tp_size=1, pp_size=1,
                                          pcp_size=1, dcp_size=1, data_parallel_index=0,
                                          data_parallel_size=1, data_parallel_rank_local=None,
                                          is_parallelism_agnostic=True))


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(8, "little") + bytes(24), 0)


def workload(steps, seed, arrive):
    """Per step, the arriving requests' keys: 24 of four shared prefixes, 16 their own."""
    rng = np.random.default_rng(seed)
    own = 10_000_000 * (seed + 1)
    out = []
    for _ in range(steps):
        reqs = []
        for _ in range(arrive):
            p = seed * 100 + int(rng.integers(PREFIXES))  # fresh prefixes each round
            keys = [key(p * 1000 + b) for b in range(SHARED)]
            keys += [key(own + b) for b in range(BLOCKS - SHARED)]
            own += BLOCKS
            reqs.append(keys)
        out.append(reqs)
    return out


def drive(mgr, steps) -> tuple[float, int, int]:
    """The connector's calls for the workload: seconds per step, blocks loaded, stored."""
    waiting: list[tuple[ReqContext, list]] = []
    inflight: list[tuple[ReqContext, list, list]] = []  # (ctx, loaded keys, stored keys)
    n = nload = nstore = 0
    t0 = time.perf_counter()
    for reqs in steps:
        for ctx, loaded, stored in inflight:
            if loaded:
                mgr.complete_load(loaded, ctx)
            if stored:
                mgr.complete_store(stored, ctx)
        inflight = []
        todo, waiting = waiting, []
        for keys in reqs:
            n += 1
            ctx = ReqContext(req_id=str(n))
            mgr.on_new_request(ctx)
            todo.append((ctx, keys))
        for ctx, keys in todo:
            hits, defer = 0, False
            for k in keys:
                r = mgr.lookup(k, ctx)
                if r is LookupResult.MISS:
                    break
                if r is LookupResult.RETRY or r is LookupResult.HIT_PENDING:
                    defer = True  # the scheduler asks again next step
                else:
                    hits += 1
            if defer:
                waiting.append((ctx, keys))
                continue
            loaded = keys[:hits]
            if loaded:
                mgr.prepare_load(loaded, ctx)
            out = mgr.prepare_store(keys[hits:], ctx)
            stored = out.keys_to_store if out else []
            nload += len(loaded)
            nstore += len(stored)
            inflight.append((ctx, loaded, stored))
        mgr.on_schedule_end(None)
    return (time.perf_counter() - t0) / len(steps), nload, nstore


def bench_managers(arrive):
    d = tempfile.mkdtemp(prefix="kvp-bench-offload-")
    # session_rows: the one engine may hold the whole tier, as vLLM's own does
    proc, url, _ = start(d, "--region-dir", "/dev/shm", "--max-ids", "65536", "--pool",
                         f"name=tier,blocks={TIER},block_size=16,executor=cpu,layers=1,heads=1,"
                         f"head_size=8,dtype=fp32,session_rows={TIER}", pool="tier")
    cfg = config(0)
    ours, theirs = [], []
    try:
        for r in range(ROUNDS):
            steps = workload(STEPS, r, arrive)
            mgr = KVPoolOffloadingManager({"kvpool_url": url, "kvpool_pool": "tier"}, cfg, 1)
            t, ol, os_ = drive(mgr, steps)
            ours.append(t)
            trips = mgr.round_trips
            mgr.shutdown()
            t, vl, vs = drive(CPUOffloadingManager(num_chunks=TIER), steps)
            theirs.append(t)
    finally:
        stop(proc)
    k, v = statistics.median(ours) * 1e6, statistics.median(theirs) * 1e6
    print(f"# scheduler side: {arrive} arrivals/step of {BLOCKS} blocks ({SHARED} shared), "
          f"{STEPS} steps, median of {ROUNDS}; kvpool {trips / STEPS:.1f} round trips/step; "
          f"blocks loaded/stored in the last round: kvpool {ol}/{os_}, vLLM {vl}/{vs}")
    print(f"offload step_us arrivals {arrive} kvpool {k:.0f} vllm {v:.0f} ratio {k / v:.2f}")
    bench_json.record("offload", f"KVPoolOffloadingManager over ipc://, {arrive} request(s) "
                      f"arriving a step ({trips / STEPS:.1f} round trips a step)", k,
                      "µs per step", "vLLM 0.33 CPUOffloadingManager, in process", v, "lower")


def bench_worker():
    d = tempfile.mkdtemp(prefix="kvp-bench-offload-")
    bb = LAYERS * PAGE
    heads = PAGE // (2 * 16 * 128 * 2)
    proc, url, _ = start(d, "--region-dir", "/dev/shm", "--max-msg-bytes", "67108864", "--pool",
                         f"name=tier,blocks={2 * NBLK + 4},block_size=16,executor=cpu,"
                         f"layers={LAYERS},heads={heads},head_size=128,dtype=bf16", pool="tier")
    try:
        gpu = [torch.randint(-128, 127, (NBLK + 1, PAGE), dtype=torch.int8) for _ in range(LAYERS)]
        kvc = CanonicalKVCaches(
            tensors=[CanonicalKVCacheTensor(tensor=t, page_size_bytes=PAGE) for t in gpu],
            group_data_refs=[[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=PAGE)
                              for i in range(LAYERS)]])
        w = KVPoolOffloadingWorker({"kvpool_url": url, "kvpool_pool": "tier"}, config(bb), kvc)
        c = kvpool.Client(url, pool="tier")
        keys = [key(i) for i in range(NBLK)]
        rows, _ = c.reserve(keys)
        spec = KVPoolRowsSpec(keys, rows)
        blocks = GPULoadStoreSpec(list(range(1, NBLK + 1)), group_sizes=[NBLK], block_indices=[0])
        src = torch.randint(-128, 127, (NBLK, bb), dtype=torch.int8)
        dst = torch.empty_like(src)

        def timed(fn, reps=7):
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts)

        job = [0]

        def store():
            job[0] += 1
            w.submit_store(job[0], blocks, spec)
            w.get_finished()

        def load():
            job[0] += 1
            w.submit_load(job[0], spec, blocks)
            w.get_finished()

        for _ in range(2):
            store(), load()
        base = timed(lambda: dst.copy_(src))
        ts, tl = timed(store), timed(load)
        base = (base + timed(lambda: dst.copy_(src))) / 2
        n = NBLK * bb
        print(f"# worker side: {NBLK} blocks of {bb} B ({LAYERS} layer pages of {PAGE} B), "
              f"torch copy {n / base / 1e9:.2f} GB/s, store {n / ts / 1e9:.2f}, "
              f"load {n / tl / 1e9:.2f}")
        print(f"offload store {n} ratio_vs_copy {base / ts:.3f}")
        print(f"offload load {n} ratio_vs_copy {base / tl:.3f}")
        for what, t in (("store", ts), ("load", tl)):
            bench_json.record("offload", f"worker {what}: {NBLK} blocks of {bb} B between KV "
                              "tensors and the region", n / t, "B/s",
                              "torch copy_ of the same bytes", n / base, "higher")
        c.abort(keys)
        c.close()
        w.shutdown()
    finally:
        stop(proc)


if __name__ == "__main__":
    for arrive in ARRIVALS:
        bench_managers(arrive)
    bench_worker()
