# SPDX-License-Identifier: Apache-2.0
"""The offloading workers' copies (kvpool.kv_copy) against a raw torch copy
of the same bytes, in one run: 64 blocks of 2 MiB (32 layer pages of 64
KiB, vLLM's canonical int8 views) stored into and loaded from a kvpoold
region's rows. Needs torch, not vLLM.

    python3 clients/python/bench/bench_kv_copy.py [--quick] [--device cuda]
        [--pages B,...] [--slices N,...] [--programs N,...] [BUILD_DIR]

On CPU tensors the baseline is copy_ between two CPU tensors; on CUDA
tensors (the region pinned) it is copy_ between the device tensor and a
pinned host tensor, each way, and the workers' copies are measured
batched (one cudaMemcpyBatchAsync) and page by page (one copy_ each).
With --device cuda the figures go to BENCHMARKS.md's GPU table
(KVP_BENCH_JSON, area gpu): the run issue #47 asks of a lent GPU. On the CPU it only prints (the offload area measures
the same copies through vLLM's worker).

--pages, --slices and --programs sweep other page sizes (bytes, multiples
of 8192: a smaller model's or a tensor-parallel shard's pages), numbers of
pages per cudaMemcpyBatchAsync (kv_copy's _BATCH_PAGES; 0: the whole job
in one batch) and, on CUDA, of programs of the page kernel (kv_copy's
_KERNEL_PROGRAMS), each way forced. A sweep only prints: the recorded row
is 64 KiB pages as kv_copy copies them."""
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

ARGS = sys.argv[1:]
QUICK = "--quick" in ARGS
DEVICE = "cpu"
if "--device" in ARGS:
    i = ARGS.index("--device")
    if i + 1 >= len(ARGS) or ARGS[i + 1] not in ("cpu", "cuda"):
        sys.exit("usage: bench_kv_copy.py [--quick] [--device cpu|cuda] [BUILD_DIR]")
    DEVICE = ARGS[i + 1]
    del ARGS[i:i + 2]


def _ints(flag, least):
    """The comma-separated integers after flag (removed from ARGS), or None."""
    if flag not in ARGS:
        return None
    i = ARGS.index(flag)
    try:
        vals = [int(v) for v in ARGS[i + 1].split(",")] if i + 1 < len(ARGS) else []
    except ValueError:
        vals = []
    if not vals or min(vals) < least:
        sys.exit(f"bench_kv_copy: {flag} takes integers of at least {least}, comma-separated")
    del ARGS[i:i + 2]
    return vals


PAGES = _ints("--pages", 8192)
SLICES = _ints("--slices", 0)
PROGRAMS = _ints("--programs", 1)
ARGS = [a for a in ARGS if a != "--quick"]
if ARGS:
    os.environ["KVPOOLD"] = os.path.join(ARGS[0], "service", "kvpoold")
    os.environ.setdefault("KVPOOL_LIB", os.path.join(ARGS[0], "clients", "c", "libkvpool.so"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvpool  # noqa: E402
from kvpool import kv_copy  # noqa: E402
from kvpool.kv_copy import PageCopier, RegionMap  # noqa: E402
from conftest import start, stop  # noqa: E402
import bench_json  # noqa: E402

LAYERS, PAGE, NBLK = (4, 65536, 16) if QUICK else (32, 65536, 64)


def main():
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_kv_copy: --device cuda, and torch sees no GPU")
    if PAGES is None and SLICES is None and PROGRAMS is None:
        return run(PAGE, [kv_copy._BATCH_PAGES], [], record=True)
    for page in PAGES or [PAGE]:
        if page % 8192:
            sys.exit("bench_kv_copy: --pages takes multiples of 8192")
        run(page, SLICES or [kv_copy._BATCH_PAGES],
            (PROGRAMS or [kv_copy._KERNEL_PROGRAMS]) if DEVICE == "cuda" else [], record=False)


def run(page, slices, programs, record):
    """Measures pages of `page` bytes against raw copy_: by the copy engines
    in batches of each of slices pages (by kv_copy's choice, when record),
    and by the page kernel in each of programs programs."""
    cuda = DEVICE == "cuda"
    saved = kv_copy._BATCH_PAGES, kv_copy._KERNEL_PROGRAMS
    d = tempfile.mkdtemp(prefix="kvp-bench-kv-copy-")
    bb = LAYERS * page
    heads = page // (2 * 16 * 128 * 2)
    rdir = "/dev/shm" if os.access("/dev/shm", os.W_OK) else d  # kvpoold's default
    # session_rows: this one client reserves nearly every row
    proc, url, _ = start(d, "--region-dir", rdir, "--pool",
                         f"name=tier,blocks={NBLK + 4},block_size=16,executor=cpu,"
                         f"layers={LAYERS},heads={heads},head_size=128,dtype=bf16,"
                         f"session_rows={NBLK + 4}", pool="tier")
    try:
        c = kvpool.Client(url, pool="tier")
        keys = [kvpool.offload_key(i.to_bytes(4, "little") * 8, 0) for i in range(NBLK)]
        rows, _ = c.reserve(keys)
        m = RegionMap(c, pin=cuda)
        if cuda and not m.pinned:
            sys.exit(f"bench_kv_copy: the region in {rdir} could not be pinned (see above)")
        kv = [torch.randint(-128, 127, (NBLK + 1, page), dtype=torch.int8, device=DEVICE)
              for _ in range(LAYERS)]
        layout = [[(i, page, i * page) for i in range(LAYERS)]]
        cp = PageCopier(kv, layout)
        blocks, rws = np.arange(1, NBLK + 1), np.array(rows)
        stream = torch.cuda.Stream() if cuda else None
        dev = torch.randint(-128, 127, (NBLK, bb), dtype=torch.int8, device=DEVICE)
        host = torch.empty((NBLK, bb), dtype=torch.int8, pin_memory=cuda)

        def sync():
            if cuda:
                stream.synchronize()

        def timed(fn, reps=3 if QUICK else 9):
            ts = []
            for k in range(reps + 1):  # the first touches every page: not timed
                t0 = time.perf_counter()
                if cuda:
                    with torch.cuda.stream(stream):
                        fn()
                else:
                    fn()
                sync()
                if k:
                    ts.append(time.perf_counter() - t0)
            return statistics.median(ts)

        n = NBLK * bb
        base_out = timed(lambda: host.copy_(dev, non_blocking=cuda))
        base_in = timed(lambda: dev.copy_(host, non_blocking=cuda))
        where = "CUDA tensors, the region pinned" if cuda else "CPU tensors"
        # On CUDA: one cudaMemcpyBatchAsync per call, and one copy_ per page
        # (what a runtime before 12.8 gets), to show what the batch buys.
        # In a sweep: the engines alone, then the kernel alone.
        engines = cp if record else PageCopier(kv, layout, kernel=False)
        ways = [("batched" if record else f"batched, {k or 'all'} pages a batch", engines, k, 0)
                for k in slices]
        ways += [(f"page kernel, {p} programs", PageCopier(kv, layout, kernel=True), 0, p)
                 for p in programs]
        if cuda and record:
            ways.append(("per-page", PageCopier(kv, layout, batched=False), 0, 0))
        for how, cpr, k, p in ways:
            if cuda and cpr is engines and cpr.batch is None:
                sys.exit("bench_kv_copy: torch's CUDA runtime has no cudaMemcpyBatchAsync")
            if p and kv_copy._page_kernel(torch.cuda.current_device()) is None:
                sys.exit("bench_kv_copy: the page kernel cannot run here (see the log)")
            kv_copy._BATCH_PAGES = k or LAYERS * NBLK
            kv_copy._KERNEL_PROGRAMS = p or saved[1]
            store = timed(lambda: cpr.copy(m, 0, blocks, rws, True))
            load = timed(lambda: cpr.copy(m, 0, blocks, rws, False))
            print(f"# {where}, {how}: {NBLK} blocks of {bb} B ({LAYERS} pages of {page} B): "
                  f"store {n / store / 1e9:.2f} GB/s (raw {n / base_out / 1e9:.2f}, "
                  f"{base_out / store:.2f}x), load {n / load / 1e9:.2f} GB/s "
                  f"(raw {n / base_in / 1e9:.2f}, {base_in / load:.2f}x)")
            if not cuda or not record:
                continue
            for what, t, base, raw in (
                    ("store", store, base_out, "torch copy_ device to pinned host"),
                    ("load", load, base_in, "torch copy_ pinned host to device")):
                bench_json.record("gpu", f"vLLM worker {what} (kvpool.kv_copy, {how}): {NBLK} "
                                  f"blocks of {bb} B in {LAYERS} pages, CUDA tensors and the "
                                  "pinned region", n / t, "B/s", f"{raw}, the same bytes",
                                  n / base, "higher")
        m.close()
        c.abort(keys)
        c.close()
    finally:
        kv_copy._BATCH_PAGES, kv_copy._KERNEL_PROGRAMS = saved
        stop(proc)


if __name__ == "__main__":
    main()
