# SPDX-License-Identifier: Apache-2.0
"""kvp-bench-engine's loops (a)-(d) on the installed vLLM 0.33's own
BlockPool and hash functions, beside kvp-bench-engine run in the same
invocation: the engine-against-vLLM ratios of BENCHMARKS.md. Then the
remote request cycle (loop (b) through a real kvpoold on ipc://, Batches
of 64 cycles, kvp-bench-service --only-batch with 1 and 8 clients) against
the same vLLM loop (b) in process.

    VENV=$(sh tests/vllm/env.sh)
    $VENV/bin/python tests/bench/bench_vllm_engine.py [--quick] [BUILD_DIR]

Medians of 5 runs (2 with --quick), each at least 0.3 s (0.05 s), pools of
100,000 blocks, block size 16, events off, as the C loops."""
import os
import re
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_json  # noqa: E402

from vllm import __version__ as vllm_version
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils as vku
from vllm.v1.core.block_pool import BlockPool

QUICK = "--quick" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--quick"]
BUILD = ARGS[0] if ARGS else os.path.join(os.path.dirname(__file__), "..", "..", "build")
REPS, MIN_S = (2, 0.05) if QUICK else (5, 0.3)
N = 100_000


def rate(ops_per_iter, body):
    t0, it = time.perf_counter(), 0
    while True:
        for _ in range(100):
            body()
        it += 100
        t = time.perf_counter() - t0
        if t >= MIN_S:
            return it * ops_per_iter / t


def median(make):
    return statistics.median(make() for _ in range(REPS))


def loop_a():
    p = BlockPool(N, True, 16)

    def body():
        p.free_blocks(reversed(p.get_new_blocks(16)))
    return rate(16, body)


def _req(hashes):
    return SimpleNamespace(block_hashes=hashes, all_token_ids=list(range(256)),
                           lora_request=None, mm_features=[], cache_salt=None,
                           session_id=None, prompt_embeds=None)


def loop_b():
    p = BlockPool(N, True, 16)
    counter = [0]
    req = _req([b""] * 16)

    def cycle(lookups):
        ids = p.get_new_blocks(16)
        c = counter[0]
        req.block_hashes = [vku.BlockHash(i.to_bytes(32, "little")) for i in range(c, c + 16)]
        counter[0] = c + 16
        p.cache_full_blocks(req, ids, 0, 16, 16, 0)
        if not lookups:
            p.free_blocks(ids)
            return
        p.free_blocks(reversed(ids))
        hits = [p.get_cached_block(h, [0])[0] for h in req.block_hashes]
        p.touch(hits)
        p.free_blocks(reversed(hits))
    for _ in range(2 * N // 16):  # warm to the steady state, as warm_b
        cycle(False)
    return rate(1, lambda: cycle(True))


def loop_c():
    p = BlockPool(N, True, 16)
    blocks = p.get_new_blocks(N - 1)
    hashes = [vku.BlockHash(i.to_bytes(32, "little")) for i in range(N - 1)]
    req = SimpleNamespace(block_hashes=hashes, all_token_ids=[], lora_request=None,
                          mm_features=[], cache_salt=None, session_id=None)
    p.cache_full_blocks(req, blocks, 0, N - 1, 16, 0)
    p.free_blocks(blocks)
    x, picks = 88172645463325252, []
    for _ in range(1024):
        x ^= (x << 13) & (2**64 - 1)
        x ^= x >> 7
        x ^= (x << 17) & (2**64 - 1)
        picks.append(p.blocks[1 + N // 4 + x % (N // 2)])
    k = [0]

    def body():
        b = picks[k[0] & 1023]
        k[0] += 1
        p.touch([b])
        p.free_blocks([b])
    return rate(1, body)


def loop_d(algo):
    fn = get_hash_fn_by_name(algo)
    os.environ["PYTHONHASHSEED"] = "0"
    vku.init_none_hash(fn)
    tokens = list(range(32768))

    def once():
        t0, parent = time.perf_counter(), None
        for i in range(0, 32768, 16):
            parent = vku.hash_block_tokens(fn, parent, tokens[i:i + 16], None)
        return (time.perf_counter() - t0) * 1e3
    return statistics.median(once() for _ in range(max(REPS, 3)))


def ours():
    out = subprocess.run([os.path.join(BUILD, "tests", "bench", "kvp-bench-engine")]
                         + (["--quick"] if QUICK else []),
                         capture_output=True, text=True, check=True).stdout
    def num(pat):
        m = re.search(pat, out)
        if not m:
            raise SystemExit(f"bench_vllm_engine: no match for {pat!r} in kvp-bench-engine's output")
        return float(m.group(1))
    return {"a": num(r"\(a\)[^|]*\| ([\d.]+)M blocks/s") * 1e6,
            "b": num(r"\(b\)[^|]*\| ([\d.]+)k cycles/s") * 1e3,
            "c": num(r"\(c\)[^|]*\| ([\d.]+)M pairs/s") * 1e6,
            "d_cbor": num(r"\(d\) hash 32k[^|]*\| ([\d.]+) ms"),
            "d_pickle": num(r"\(d\) the same with hash_algo sha256 \(pickle\) \| ([\d.]+) ms")}


def remote():
    """kvp-bench-service's batched remote cycle: cycles/s with 1 and 8 clients."""
    bench = os.path.join(BUILD, "tests", "bench", "kvp-bench-service")
    daemon = os.path.join(BUILD, "service", "kvpoold")
    got = {}
    for clients in (1, 8):
        out = subprocess.run([bench, f"--only-batch={clients}", daemon], capture_output=True,
                             text=True, check=True).stdout
        m = re.search(r"ipc, %d client\(s\), batches: (\d+) cycles/s" % clients, out)
        if not m:
            raise SystemExit(f"bench_vllm_engine: no batched row in kvp-bench-service's output:\n{out}")
        got[clients] = float(m.group(1))
    return got


def main():
    k = ours()
    r = remote()
    v = {"a": median(loop_a), "b": median(loop_b), "c": median(loop_c),
         "d_cbor": loop_d("sha256_cbor"), "d_pickle": loop_d("sha256")}
    print(f"kvp-bench-engine beside vLLM {vllm_version}'s own BlockPool and hashes, one run; "
          f"medians of {REPS}, pools of {N:,} blocks, block size 16, events off\n")
    print("| loop | kvpool | vLLM 0.33 (Python) | kvpool / vLLM |")
    print("|---|---|---|---|")
    rows = [("(a) get_new_blocks(16) + free reversed", "a", "M blocks/s", 1e6, False),
            ("(b) request cycle (alloc, cache 16, free, 16 lookups, touch, free)", "b",
             "k cycles/s", 1e3, False),
            ("(c) touch + free, mid-queue cached block", "c", "M pairs/s", 1e6, False),
            ("(d) hash 32k tokens, 16-token blocks, sha256_cbor", "d_cbor", "ms", 1, True),
            ("(d) the same, sha256 (pickle; vLLM's default)", "d_pickle", "ms", 1, True)]
    for name, key, unit, scale, lower in rows:
        ratio = v[key] / k[key] if lower else k[key] / v[key]
        print(f"| {name} | {k[key] / scale:.3g} {unit} | {v[key] / scale:.3g} {unit} | "
              f"{ratio:.1f}x |")
        bench_json.record("engine", name, k[key], unit.split(" ", 1)[-1] if scale != 1 else unit,
                          f"vLLM {vllm_version} BlockPool, in process", v[key],
                          "lower" if lower else "higher")
    for clients, rate_ in sorted(r.items()):
        print(f"| (b) remote: kvpoold on ipc://, Batches of 64 cycles, {clients} client(s) | "
              f"{rate_ / 1e3:.3g} k cycles/s | {v['b'] / 1e3:.3g} k cycles/s | "
              f"{rate_ / v['b']:.1f}x |")
        bench_json.record("engine", f"(b) remote: kvpoold on ipc://, Batches of 64 cycles, "
                          f"{clients} client(s)", rate_, "cycles/s",
                          f"vLLM {vllm_version} BlockPool, in process", v["b"], "higher")


if __name__ == "__main__":
    main()
