# SPDX-License-Identifier: Apache-2.0
"""The Python package's cost beside the C client's, in one run.

    python3 clients/python/bench/bench_python.py [--rounds 5] [--prefetch] [BUILD_DIR]

Starts one kvpoold (BUILD_DIR/service/kvpoold) on ipc://, then for each
round runs, interleaved and in this one process: the C client
(kvp_bench_client_run of BUILD_DIR/tests/bench/libkvp_bench_client.so,
the code of kvp-bench-client, over the same libkvpool.so) and this package
through the same calls: a loop of Stats, a loop of
Allocate(16)+Free, and the scheduler step workload that bench_client.c
describes (256 running requests; 8 finish, 248 decode, 8 arrive with a
Lookup each for their prefix hit, as one Batch; the C client adds the
decodes with one kvp_batch_allocate_slots_n), here through
kvpool.vllm.RemoteKVCacheManager's step mode. Each run gets its own fresh
pool. With --prefetch, each round also runs the step with the 8 arrivals'
Lookups sent as one Batch before it (RemoteKVCacheManager's
prefetch_computed_blocks; kvp-bench-client's step-prefetch), two round
trips a step. Prints medians over the rounds and the ratios Python / C, of wall
time and of the client process's CPU time (every thread, nng's included):
the added CPU is what Python itself costs, free of the scheduling noise
that a round trip on a small machine carries."""
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))
import bench_json  # noqa: E402

SYS_TOKENS, OWN_TOKENS, BS, RUNNING, TURNOVER = 128, 32, 16, 256, 8
PROMPT = SYS_TOKENS + OWN_TOKENS


class Req:
    """What RemoteKVCacheManager reads of a vLLM Request."""
    __slots__ = ("request_id", "all_token_ids", "block_hashes", "lora_request", "cache_salt",
                 "mm_features")

    def __init__(self, r, hasher):
        toks = [(r % 4) * 100000 + i for i in range(SYS_TOKENS)]
        toks += [10000000 + r * OWN_TOKENS + j for j in range(OWN_TOKENS)]
        self.request_id = r
        self.all_token_ids = toks
        self.block_hashes = hasher.hash_request(toks, BS)
        self.lora_request = self.cache_salt = self.mm_features = None

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


def py_step(m, reqs, running, nxt, admit, finish, mark=None, prefetch=False):
    """bench_client.c's step through RemoteKVCacheManager (get_computed_blocks,
    then one Step). mark(phase), if given, is called as each phase ends.
    prefetch: the arrivals' hits are looked up first in one round trip
    (prefetch_computed_blocks, as kvp-bench-client's step-prefetch)."""
    mark = mark or (lambda phase: None)
    if prefetch:
        m.prefetch_computed_blocks(reqs[nxt:nxt + admit])
    hits = []
    for k in range(admit):
        hits.append(m.get_computed_blocks(reqs[nxt + k]))
        mark(f"get_computed_blocks {k + 1}")
    with m.step() as s:
        for _ in range(finish):
            s.free(running.pop(0))
        for q in running:
            q.all_token_ids.append(7)
            s.allocate_slots(q, 1)
        for k in range(admit):
            q = reqs[nxt + k]
            blocks, hit = hits[k][:2]
            s.allocate_slots(q, PROMPT - hit, hit, blocks)
            running.append(q)
        mark("queueing the Step's calls")
        got = s.commit()
        mark("commit (one Batch)")
    if any(g is None for g in got[finish:]):
        raise RuntimeError("a request did not fit: the pool is too small for the bench")
    return nxt + admit


class _StubStep:
    """A Step that does nothing: what the interpreter alone costs to make
    the step's calls (py_step_floor)."""

    def __init__(self):
        self.n = 0

    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, num_lookahead_tokens=0,
                       num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False):
        self.n += 1
        return self.n - 1

    def free(self, request):
        self.n += 1
        return self.n - 1

    def commit(self):
        return [()] * self.n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class _StubManager:
    """RemoteKVCacheManager's step-mode surface with nothing behind it."""

    def get_computed_blocks(self, request):
        return (), 0

    def step(self):
        return _StubStep()


def py_step_floor(reqs, n):
    """µs per step of py_step's own Python (its loops and the calls it
    makes, vLLM's call shape) on _StubManager: no package, no network. The
    least any Python client of this shape adds."""
    running, nxt, m = [], 0, _StubManager()
    for _ in range(RUNNING // 32):
        nxt = py_step(m, reqs, running, nxt, 32, 0)
    t0 = time.perf_counter()
    for _ in range(n):
        nxt = py_step(m, reqs, running, nxt, TURNOVER, TURNOVER)
    return (time.perf_counter() - t0) / n * 1e6


def timed_phases(m, acc):
    """Wraps m.get_computed_blocks and the package's one Batch send
    (Batch._transmit, which makes the same kvp_client_batch call the C
    client makes) to add their seconds to acc[0] and acc[1]; returns a
    function that undoes the wraps."""
    import kvpool.batch as kb
    orig = kb.Batch._transmit

    def timed(f, k):
        def run(*args):
            t = time.perf_counter()
            try:
                return f(*args)
            finally:
                acc[k] += time.perf_counter() - t
        return run
    kb.Batch._transmit = timed(orig, 1)
    m.get_computed_blocks = timed(m.get_computed_blocks, 0)

    def undo():
        kb.Batch._transmit = orig
        del m.get_computed_blocks
    return undo


def py_run(kvpool, url, pool, mode, n):
    """(wall µs, process CPU µs, µs in the step's Lookups and in its Batch
    send or None) per op, as kvp-bench-client reports them."""
    from kvpool.vllm import RemoteKVCacheManager
    acc, undo = [0.0, 0.0], None
    with kvpool.Client(url, pool=pool, timeout_ms=10000) as c:
        if mode == "stats":
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(n):
                c.stats()
        elif mode == "alloc":
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(n):
                c.free(c.allocate(16))
        else:
            h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
            reqs = [Req(r, h) for r in range(RUNNING + n * TURNOVER)]
            m = RemoteKVCacheManager(c)
            running, nxt = [], 0
            for _ in range(RUNNING // 32):
                nxt = py_step(m, reqs, running, nxt, 32, 0)
            undo = timed_phases(m, acc)
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                for _ in range(n):
                    nxt = py_step(m, reqs, running, nxt, TURNOVER, TURNOVER,
                                  prefetch=mode == "step-prefetch")
            finally:
                undo()
        return ((time.perf_counter() - t0) / n * 1e6, (time.process_time() - c0) / n * 1e6,
                [a / n * 1e6 for a in acc] if undo else None)


def py_breakdown(kvpool, url, pool, n):
    """The Python step cut into its phases (medians over n steps, µs): a
    Stats sent right after the previous step's commit, a second Stats, each
    of the 8 get_computed_blocks, queueing the Step's calls, and commit."""
    from kvpool.vllm import RemoteKVCacheManager
    t, last = {}, [0.0]

    def mark(phase):
        now = time.perf_counter()
        t.setdefault(phase, []).append(now - last[0])
        last[0] = now

    with kvpool.Client(url, pool=pool, timeout_ms=10000) as c:
        h = kvpool.Hasher("0", algorithm=c.info["hash_algorithm"])
        reqs = [Req(r, h) for r in range(RUNNING + (n + 1) * TURNOVER)]
        m = RemoteKVCacheManager(c)
        running, nxt = [], 0
        for _ in range(RUNNING // 32):
            nxt = py_step(m, reqs, running, nxt, 32, 0)
        for _ in range(n):
            last[0] = time.perf_counter()
            c.stats()
            mark("Stats right after a step")
            c.stats()
            mark("Stats after a Stats")
            nxt = py_step(m, reqs, running, nxt, TURNOVER, TURNOVER, mark)
    return {k: statistics.median(v) * 1e6 for k, v in t.items()}


def c_run(mod, url, pool, mode, n):
    """The C client's (wall µs, process CPU µs, µs in the step's Lookups and
    in its Batch send or None) per op, in this process."""
    us, cpu = ctypes.c_double(), ctypes.c_double()
    rv = mod.kvp_bench_client_run(url.encode(), pool.encode(), mode.encode(), n,
                                  ctypes.byref(us), ctypes.byref(cpu))
    if rv != 0:
        raise RuntimeError(f"kvp_bench_client_run {mode}: {rv}")
    return us.value, cpu.value, ([mod.kvp_bench_client_phase_us(k) for k in (0, 1)]
                                 if mode.startswith("step") else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    ap.add_argument("--no-pin", action="store_true",
                    help="do not pin the daemon and this process to separate CPUs")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the Python step's phases, on a pool of its own")
    ap.add_argument("--c-variants", action="store_true",
                    help="also run the C step with its caches disturbed before each call "
                         "(step-cold) and busy for KVP_BENCH_GAP_US (350) µs before each call "
                         "(step-gap), 2 rounds each: does a client's work between calls slow "
                         "the calls themselves?")
    ap.add_argument("--prefetch", action="store_true",
                    help="also run the step with the arrivals' Lookups as one Batch "
                         "(prefetch_computed_blocks; kvp-bench-client step-prefetch), "
                         "interleaved in the same rounds, on pools of its own (so at most "
                         "--rounds 3: a kvpoold holds 16 pools)")
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    pin = not a.no_pin and len(cpus) >= 2
    if pin:  # the daemon on one CPU, both clients on another: less scheduling noise
        os.sched_setaffinity(0, {cpus[0]})
    os.environ.setdefault("KVPOOL_LIB", os.path.join(a.build, "clients", "c", "libkvpool.so.0.2"))
    import kvpool
    kvpoold = os.path.join(a.build, "service", "kvpoold")
    mod = ctypes.CDLL(os.path.join(a.build, "tests", "bench", "libkvp_bench_client.so"))
    mod.kvp_bench_client_run.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.c_long, ctypes.POINTER(ctypes.c_double),
                                         ctypes.POINTER(ctypes.c_double)]
    mod.kvp_bench_client_phase_us.restype = ctypes.c_double
    mod.kvp_bench_client_phase_us.argtypes = [ctypes.c_int]
    counts = {"stats": 2000, "alloc": 2000, "step": 40}
    if a.quick:
        counts = {"stats": 200, "alloc": 200, "step": 5}
    d = tempfile.mkdtemp(prefix="kvpool-bench-py-")
    url = f"ipc://{d}/rpc.ipc"
    pools = []
    steps = ("step", "step-prefetch") if a.prefetch else ("step",)
    for r in range(a.rounds):
        for mode in steps:
            for who in ("c", "py"):
                pools += ["--pool", f"name={mode}-{who}{r},blocks=16384,block_size={BS},"
                                    "seed=0,executor=none"]
    if a.breakdown:
        pools += ["--pool", f"name=step-bd,blocks=16384,block_size={BS},seed=0,executor=none"]
    variants = ("step-cold", "step-gap") if a.c_variants else ()
    for v in variants:
        for r in range(2):
            pools += ["--pool", f"name={v}{r},blocks=16384,block_size={BS},seed=0,executor=none"]
    if len(pools) // 2 + 1 > 16:
        ap.error("too many pools for one kvpoold (16): use fewer --rounds")
    taskset = ["taskset", "-c", str(cpus[1])] if pin else []
    proc = subprocess.Popen(taskset + [kvpoold, "--quiet", "--rpc", url, "--admin", "none",
                                       "--events", "none", "--lease-ms", "60000", "--pool",
                                       "name=bench,blocks=4096,block_size=16,executor=none",
                                       *pools])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                kvpool.Client(url, pool="bench", timeout_ms=500, retries=0).close()
                break
            except (kvpool.Unavailable, kvpool.Busy):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        if a.prefetch:
            counts["step-prefetch"] = counts["step"]
        res = {(m, w): [] for m in counts for w in ("c", "py")}
        for r in range(a.rounds):
            for mode, n in counts.items():
                pool = "bench" if not mode.startswith("step") else None
                res[(mode, "c")].append(c_run(mod, url, pool or f"{mode}-c{r}", mode, n))
                res[(mode, "py")].append(py_run(kvpool, url, pool or f"{mode}-py{r}", mode, n))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
        bd = py_breakdown(kvpool, url, "step-bd", counts["step"]) if a.breakdown else None
        var = {v: [c_run(mod, url, f"{v}{r}", v, counts["step"]) for r in range(2)]
               for v in variants}
        floor_reqs = [Req(r, kvpool.Hasher("0")) for r in range(RUNNING + 200 * TURNOVER)]
        floor = statistics.median(py_step_floor(floor_reqs, 200) for _ in range(a.rounds))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    calls = TURNOVER * 2 + (RUNNING - TURNOVER)
    print(f"| measure (median of {a.rounds} interleaved rounds) | C client | Python | "
          "Python / C | Python's added time / C's | client CPU, C | client CPU, Python | "
          "Python's added CPU / C's wall |")
    print("|---|---|---|---|---|---|---|---|")
    med = {}
    rows = [("stats", "Stats, µs per call"), ("alloc", "Allocate(16)+Free, µs per pair"),
            ("step", f"step ({calls} request calls + {TURNOVER} Lookups), µs")]
    if a.prefetch:
        rows.append(("step-prefetch", f"step, its {TURNOVER} Lookups as one Batch "
                                      "(prefetch_computed_blocks), µs"))
    for mode, label in rows:
        cw, pw = (statistics.median(v[0] for v in res[(mode, w)]) for w in ("c", "py"))
        cc, pc = (statistics.median(v[1] for v in res[(mode, w)]) for w in ("c", "py"))
        med[mode] = (cw, pw)
        print(f"| {label} | {cw:.1f} | {pw:.1f} | {pw / cw:.3f} | {(pw - cw) / cw * 100:.1f}% | "
              f"{cc:.1f} | {pc:.1f} | {(pc - cc) / cw * 100:.1f}% |")
        bench_json.record("python", label.replace(", µs per call", "").replace(", µs per pair", "")
                          .replace(", µs", ""), pw, "µs", "the C client, same calls, same run",
                          cw, "lower")
    cs, ps = med["step"]
    print(f"| step, µs per request call | {cs / calls:.2f} | {ps / calls:.2f} | | | | | |")
    cl, pl = (statistics.median(v[2][0] for v in res[("step", w)]) for w in ("c", "py"))
    cb, pb = (statistics.median(v[2][1] for v in res[("step", w)]) for w in ("c", "py"))
    for label, c, p in ((f"the {TURNOVER} Lookups (get_computed_blocks)", cl, pl),
                        ("the step's Batch send (kvp_client_batch)", cb, pb),
                        ("the rest (building the Batch, reading its results)",
                         cs - cl - cb, ps - pl - pb)):
        print(f"| - {label}, µs | {c:.1f} | {p:.1f} | {p / c:.3f} | "
              f"{(p - c) / cs * 100:.1f}% of C's step | | | |")
    print(f"| the step's calls on a stub manager (py_step_floor: no package, no network), µs "
          f"| | {floor:.1f} | | {floor / cs * 100:.1f}% of C's step | | | |")
    if var:
        print("\nThe C step's calls when the client does other work between them (µs per "
              "call, medians; the plain C and Python rows are from the rounds above):\n")
        print("| client | one Lookup | the Batch send |\n|---|---|---|")
        print(f"| C, calls back to back | {cl / TURNOVER:.1f} | {cb:.1f} |")
        for v, label in (("step-cold", "C, a 4 MiB buffer walked before each call"),
                         ("step-gap", f"C, {os.environ.get('KVP_BENCH_GAP_US', '350')} µs "
                                      "of busy work before each call")):
            vl = statistics.median(x[2][0] for x in var[v]) / TURNOVER
            vb = statistics.median(x[2][1] for x in var[v])
            print(f"| {label} | {vl:.1f} | {vb:.1f} |")
        print(f"| Python (RemoteKVCacheManager) | {pl / TURNOVER:.1f} | {pb:.1f} |")
    if bd:
        print(f"\nThe Python step's phases (medians of {counts['step']} steps, µs):\n")
        print("| phase | µs |\n|---|---|")
        for k, v in bd.items():
            print(f"| {k} | {v:.1f} |")

if __name__ == "__main__":
    main()
