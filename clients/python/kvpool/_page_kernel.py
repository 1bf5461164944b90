# SPDX-License-Identifier: Apache-2.0
"""Small pages copied by GPU threads rather than the copy engines.

A copy engine pays about a microsecond for each page of a batch, so pages
of a few KiB (a small model's, or a tensor-parallel worker's slice of a
larger one) move at a fraction of the link's speed. A kernel whose threads
load and store the pages through their addresses (the region pinned, so
the GPU reaches it by its host address) pays no such cost per page: vLLM
0.33's own CPU tier copies its small loads the same way. Imported only
where torch has CUDA and Triton is installed (vLLM depends on it).
"""
import triton
import triton.language as tl


@triton.jit
def _copy_pages(desc, n, CHUNK: tl.constexpr):
    """desc holds n destinations, then n sources, then n lengths in 8-byte
    words; each program copies every num_programs-th page, CHUNK words a step."""
    lanes = tl.arange(0, CHUNK)
    for k in range(tl.program_id(0), n, tl.num_programs(0)):
        dst = tl.load(desc + k).to(tl.pointer_type(tl.int64))
        src = tl.load(desc + n + k).to(tl.pointer_type(tl.int64))
        words = tl.load(desc + 2 * n + k)
        for at in range(0, words, CHUNK):
            w = at + lanes
            ok = w < words
            tl.store(dst + w, tl.load(src + w, mask=ok), mask=ok)


def launch(desc, n: int, programs: int, longest: int) -> None:
    """Queues the copy of desc's n pages (desc on the device, int64) on torch's
    current stream, in min(programs, n) programs; longest: the largest page's
    bytes, which sets how many words a step moves (at most 1024)."""
    chunk = min(triton.next_power_of_2(max(longest // 8, 1)), 1024)
    _copy_pages[(max(min(programs, n), 1),)](desc, n, CHUNK=chunk)
