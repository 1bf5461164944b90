# SPDX-License-Identifier: Apache-2.0
"""kvpool.kv_copy, the copies vLLM's offloading workers make, on their own
(torch, no vLLM): pages of vLLM-shaped KV tensors to and from one worker's
shard of a real kvpoold's region rows, and every refusal. On CPU tensors
here; on CUDA tensors, the region pinned (on /dev/shm) or not (on disk),
where torch sees a GPU."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

import kvpool  # noqa: E402
from kvpool import kv_copy  # noqa: E402
from kvpool.kv_copy import PageCopier, RegionMap, cuda_batch  # noqa: E402

from conftest import start, stop  # noqa: E402

PAGE = 1024  # one worker's page of one layer: 2 x 16 tokens x 1 head x 8 x fp32
LAYERS = 2


def open_pool(tmp_path, region_dir):
    proc, url, _ = start(tmp_path, "--region-dir", str(region_dir), "--pool",
                         f"name=tier,blocks=16,block_size=16,executor=cpu,layers={LAYERS},"
                         "heads=2,head_size=8,dtype=fp32,shards=2", pool="tier")
    return proc, kvpool.Client(url, pool="tier")


@pytest.fixture
def pool(tmp_path):
    """A region pool of 16 rows of 2 shards, each shard room for LAYERS pages."""
    proc, c = open_pool(tmp_path, tmp_path)
    yield c
    c.close()
    stop(proc)


@pytest.fixture(params=["tmpfs", "disk"])
def any_pool(request, tmp_path):
    """The pool's region on /dev/shm (CUDA pins it) or on the test's directory
    (Linux may refuse to pin a disk file's pages: the copies must not care)."""
    tmpfs = request.param == "tmpfs"
    if tmpfs and not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    proc, c = open_pool(tmp_path, "/dev/shm" if tmpfs else tmp_path)
    yield c, tmpfs
    c.close()
    stop(proc)


def kv(device="cpu"):
    """vLLM's canonical views: int8 (blocks, page) per layer, block 0 the null block."""
    return [torch.randint(-128, 127, (4, PAGE), dtype=torch.int8, device=device)
            for _ in range(LAYERS)]


LAYOUT = [[(i, PAGE, i * PAGE) for i in range(LAYERS)]]


def roundtrip(c, tensors, pin, sync, batched=True, must_pin=False, kernel=None):
    keys = [kvpool.offload_key(bytes([5, i]) * 16, 0) for i in range(2)]
    rows, _ = c.reserve(keys)
    m = RegionMap(c, pin=pin)
    try:
        assert m.pinned or not must_pin, "a region on /dev/shm was not pinned"
        cp = PageCopier(tensors, LAYOUT, rank=1, batched=batched, kernel=kernel)
        if tensors[0].is_cuda and batched:
            cuda = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
            assert (cp.batch is not None) == (cuda >= (12, 8)), "cudaMemcpyBatchAsync not found"
        blocks = np.array([1, 3])
        assert cp.copy(m, 0, blocks, np.array(rows), store=True) == 2 * LAYERS * PAGE
        sync()
        for row, blk in zip(rows, blocks):
            shard = bytes(m.region.shard(row, 1))
            want = b"".join(bytes(t[blk].cpu().numpy()) for t in tensors)
            assert shard[:len(want)] == want
            assert bytes(m.region.shard(row, 0)) != want[:m.shard_bytes]  # rank 0's untouched
        way = ("kernel" if kernel and m.pinned else "host" if not tensors[0].is_cuda
               else "batched" if cp.batch is not None else "copy_")
        assert cp.pages_by[way] == 2 * LAYERS and sum(cp.pages_by.values()) == 2 * LAYERS
        kept = [t.clone() for t in tensors]
        for t in tensors:
            t.zero_()
        assert cp.copy(m, 0, blocks, np.array(rows), store=False) == 2 * LAYERS * PAGE
        sync()
        for t, k in zip(tensors, kept):
            assert torch.equal(t[1], k[1]) and torch.equal(t[3], k[3])
            assert not t[0].any() and not t[2].any()  # other blocks untouched
    finally:
        m.close()
        c.abort(keys)


def test_pages_to_and_from_a_shard_of_the_rows(pool):
    roundtrip(pool, kv(), pin=False, sync=lambda: None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch here")
@pytest.mark.parametrize("way", ["batched", "per-page", "kernel"])
def test_cuda_pages_through_the_region(any_pool, way):
    """By the copy engines (in batches, or a copy_ a page), or by the page
    kernel (which a region that could not be pinned sends to the engines)."""
    c, tmpfs = any_pool
    if way == "kernel" and kv_copy._page_kernel(torch.cuda.current_device()) is None:
        pytest.skip("the page kernel cannot run here (no Triton, or no host pointers)")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        roundtrip(c, kv("cuda"), pin=True, sync=stream.synchronize, batched=way != "per-page",
                  must_pin=tmpfs, kernel=way == "kernel")
    x = torch.ones(4, device="cuda")  # nothing a failed registration left is raised later
    assert float(x.sum()) == 4.0


KERNEL_ON_CPU = """
import numpy as np, torch
from kvpool import _page_kernel as k
src = torch.randint(-128, 127, (5, 20480), dtype=torch.int8)
dst = torch.zeros(5, 24576, dtype=torch.int8)
pages = [(0, 2), (3, 0), (1, 4)]  # (source block, destination block)
lens = [20000, 2048, 8]  # 3 steps of 1024 words, one step, one word
d = np.array([dst[b].data_ptr() for _, b in pages], np.int64)
s = np.array([src[a].data_ptr() for a, _ in pages], np.int64)
k.launch(torch.from_numpy(np.concatenate([d, s, np.array(lens, np.int64) // 8])), 3, 2,
         max(lens))  # 3 pages, 2 programs
for (a, b), n in zip(pages, lens):
    assert torch.equal(dst[b, :n], src[a, :n]), (a, b)
    assert not dst[b, n:].any(), "copied past a page"
assert not dst[1].any() and not dst[3].any(), "wrote a page not asked for"
print("ok")
"""


def test_the_page_kernel_in_tritons_interpreter():
    """The page kernel's own logic (its steps, masks, programs striding over
    pages) on the CPU, run by Triton's interpreter through raw addresses as
    a GPU runs it; the GPU itself runs it in test_cuda_pages_through_the_region."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(HERE)] + sys.path))
    r = subprocess.run([sys.executable, "-c", KERNEL_ON_CPU], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


class _BrokenKernel:
    @staticmethod
    def launch(*args):
        raise RuntimeError("no kernel today")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch here")
def test_cuda_a_failed_kernel_leaves_the_pages_to_the_engines(tmp_path, monkeypatch):
    """Small pages into a pinned region go by the page kernel; where Triton
    cannot build or launch it, the same call copies them by the engines."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    monkeypatch.setattr(kv_copy, "_kernel", _BrokenKernel)
    proc, c = open_pool(tmp_path, "/dev/shm")
    try:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            roundtrip(c, kv("cuda"), pin=True, sync=stream.synchronize, must_pin=True)
        assert kv_copy._kernel is False  # not tried again
    finally:
        c.close()
        stop(proc)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch here")
def test_cuda_refusals(pool):
    if cuda_batch() is not None:  # the legacy default stream takes no batch
        with pytest.raises(ValueError, match="default stream"):
            z = np.zeros(1, dtype=np.uint64)
            cuda_batch()(z, z, z, 0, src_any=False)


def test_refusals(pool):
    with pytest.raises(ValueError, match="CUDA tensors only"):
        PageCopier(kv(), LAYOUT, kernel=True)
    with pytest.raises(ValueError, match="canonical"):
        PageCopier([torch.zeros(4, 256, dtype=torch.float32)], [[(0, PAGE, 0)]])
    with pytest.raises(ValueError, match="larger than its block"):
        PageCopier([torch.zeros(4, PAGE // 2, dtype=torch.int8)], [[(0, PAGE, 0)]])
    with pytest.raises(ValueError, match="names tensor 3"):
        PageCopier(kv(), [[(3, PAGE, 0)]])
    m = RegionMap(pool)
    try:
        too_wide = PageCopier(kv(), [[(0, PAGE, m.shard_bytes)]])
        with pytest.raises(ValueError, match="cannot hold"):
            too_wide.copy(m, 0, np.array([1]), np.array([1]), store=True)
        with pytest.raises(ValueError, match="differ in number"):
            PageCopier(kv(), LAYOUT).copy(m, 0, np.array([1, 2]), np.array([1]), store=True)
    finally:
        m.close()
