# SPDX-License-Identifier: Apache-2.0
"""The scheduler step through kvpool.vllm.RemoteKVCacheManager (step mode,
one Batch a step, over ipc:// to kvpoold) against the installed vLLM
0.33's own in-process KVCacheManager, in one run, with vLLM's own Request
objects and block hasher on both sides.

    VENV=$(sh tests/vllm/env.sh)
    $VENV/bin/python clients/python/bench/bench_vllm_step.py [--quick] [BUILD_DIR]

The workload is bench_python.py's (kvp-bench-client's step): 256 running
requests of a 160-token prompt (128 tokens shared four ways), each step 8
finish, 248 decode one token, and 8 arrive with their prefix hit looked up
first. Each round runs both managers for N steps on fresh state (a fresh
pool for kvpool); prints the median µs per step over the rounds and the
ratio, kvpool / vLLM (the aim: 1.5 or less)."""
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
os.environ.pop("PYTHONHASHSEED", None)  # a default vLLM's seed

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm import __version__ as vllm_version  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils as vku  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec)
from vllm.v1.request import Request  # noqa: E402

import kvpool  # noqa: E402
from kvpool.vllm import RemoteKVCacheManager  # noqa: E402
from conftest import start, stop  # noqa: E402
import bench_json  # noqa: E402

QUICK = "--quick" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--quick"]
if ARGS:
    os.environ["KVPOOLD"] = os.path.join(ARGS[0], "service", "kvpoold")
ROUNDS, STEPS = (2, 20) if QUICK else (5, 100)
SYS_TOKENS, OWN_TOKENS, BS, RUNNING, TURNOVER, BLOCKS = 128, 32, 16, 256, 8, 8192
PROMPT = SYS_TOKENS + OWN_TOKENS
HASH = get_hash_fn_by_name("sha256")
vku.init_none_hash(HASH)
HASHER = vku.get_request_block_hasher(BS, HASH)
PARAMS = SamplingParams(max_tokens=1 << 20)


def requests(n, tag):
    out = []
    for r in range(n):
        toks = [(r % 4) * 100000 + i for i in range(SYS_TOKENS)]
        toks += [10000000 + r * OWN_TOKENS + j for j in range(OWN_TOKENS)]
        out.append(Request(f"{tag}{r}", toks, PARAMS, None, block_hasher=HASHER))
    return out


def step(m, reqs, running, nxt, admit, finish, remote, seen, prefetch=False):
    """One scheduler step as vLLM's Scheduler makes the calls; the token the
    model produced is appended after the step, as the engine core does.
    seen collects the prefix hits, which both managers must agree on.
    prefetch: the arrivals' Lookups go first as one Batch
    (RemoteKVCacheManager.prefetch_computed_blocks)."""
    if prefetch:
        m.prefetch_computed_blocks(reqs[nxt:nxt + admit])
    hits = [m.get_computed_blocks(reqs[nxt + k])[:2] for k in range(admit)]
    seen.extend(h for _, h in hits)
    if remote:
        ctx = m.step()
        s = ctx.__enter__()
    else:
        s = m
    for _ in range(finish):
        s.free(running.pop(0))
    for q in running:
        s.allocate_slots(q, 1)
    for k in range(admit):
        q = reqs[nxt + k]
        blocks, hit = hits[k]
        q.num_computed_tokens = hit
        s.allocate_slots(q, PROMPT - hit, hit, blocks)
        running.append(q)
    if remote:
        got = s.commit()
        ctx.__exit__(None, None, None)
        if any(g is None for g in got[finish:]):
            raise RuntimeError("a request did not fit")
    for q in running:  # the model ran: one token each
        q.num_computed_tokens = q.num_tokens
        q.append_output_token_ids(7)
    return nxt + admit


def run(m, remote, tag, prefetch=False):
    """(µs per step, every prefix hit in tokens)."""
    reqs = requests(RUNNING + STEPS * TURNOVER, tag)
    running, nxt, seen = [], 0, []
    for _ in range(RUNNING // 32):
        nxt = step(m, reqs, running, nxt, 32, 0, remote, seen)
    t0 = time.perf_counter()
    for _ in range(STEPS):
        nxt = step(m, reqs, running, nxt, TURNOVER, TURNOVER, remote, seen, prefetch)
    return (time.perf_counter() - t0) / STEPS * 1e6, seen


def vllm_manager():
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    cfg = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=BS, hash_block_size=BS,
                          enable_caching=True)


def remote_run(d, tag, prefetch):
    """run() on RemoteKVCacheManager over a fresh kvpoold's fresh pool."""
    os.makedirs(d)
    proc, url, _ = start(d, "--pool", f"name=s,blocks={BLOCKS},block_size={BS},executor=none",
                         pool="s")
    try:
        with kvpool.Client(url, pool="s", timeout_ms=10000) as c:
            return run(RemoteKVCacheManager(c), True, tag, prefetch)
    finally:
        stop(proc)


def main():
    ours, pre, theirs = [], [], []
    with tempfile.TemporaryDirectory() as d:
        for r in range(ROUNDS):
            t, want = run(vllm_manager(), False, f"v{r}-")
            theirs.append(t)
            o, got = remote_run(os.path.join(d, f"{r}"), f"k{r}-", False)
            p, got_p = remote_run(os.path.join(d, f"{r}p"), f"p{r}-", True)
            if got != want or got_p != want or not any(want):
                raise SystemExit(f"bench_vllm_step: prefix hits differ (kvpool {sum(got)} and "
                                 f"{sum(got_p)}, vLLM {sum(want)} tokens): the ratio would "
                                 "compare different work")
            ours.append(o)
            pre.append(p)
    o, p, t = statistics.median(ours), statistics.median(pre), statistics.median(theirs)
    print(f"scheduler step (256 running; 8 finish, 248 decode, 8 arrive), vLLM {vllm_version}; "
          f"medians of {ROUNDS} rounds of {STEPS} steps")
    print("| manager | µs per step | / vLLM |")
    print("|---|---|---|")
    print(f"| vLLM 0.33 KVCacheManager, in process | {t:.0f} | 1.00 |")
    print(f"| kvpool RemoteKVCacheManager, step mode over ipc:// (vLLM's call shape: "
          f"a Lookup per arrival, then the step's Batch) | {o:.0f} | {o / t:.2f} |")
    print(f"| the same with prefetch_computed_blocks (the arrivals' Lookups as one Batch) "
          f"| {p:.0f} | {p / t:.2f} |")
    base = f"vLLM {vllm_version} KVCacheManager, in process"
    bench_json.record("step", "RemoteKVCacheManager over ipc://, vLLM's call shape (a Lookup "
                      "per arrival, then the step's Batch)", o, "µs per step", base, t, "lower")
    bench_json.record("step", "the same with prefetch_computed_blocks (the arrivals' Lookups as "
                      "one Batch)", p, "µs per step", base, t, "lower")
    print(f"rounds, µs per step: vLLM {[round(x) for x in theirs]}, "
          f"kvpool {[round(x) for x in ours]}, with prefetch {[round(x) for x in pre]}")


if __name__ == "__main__":
    main()
