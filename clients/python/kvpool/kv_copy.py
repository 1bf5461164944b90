# SPDX-License-Identifier: Apache-2.0
"""Pages between KV cache tensors and rows of kvpoold's shared region.

vLLM's offloading workers (kvpool.vllm_offload) copy with these; they need
torch and the region, not vLLM, so the copies are tested and measured on
their own, on CPU tensors here and on CUDA tensors where a GPU is.

A row holds one block of every layer: shard `rank` of the row (one
tensor-parallel worker's slice) holds, per layer tensor of the block's
group, that tensor's page of the block at the layer's offset. The tensors
are vLLM's canonical views (CanonicalKVCacheTensor): int8, (blocks, bytes),
block b's page at b x the first stride.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

import kvpool
from kvpool import _lib as L

__all__ = ["RegionMap", "PageCopier"]


class RegionMap:
    """The region of the pool `client` is connected to, mapped as an int8
    tensor, pinned for CUDA copies when `pin`. epoch is the pool's life
    (Hello's event_epoch): each kvpoold start has a new region file."""

    def __init__(self, client: kvpool.Client, pin: bool = False):
        import torch
        self._torch = torch
        self.client = client
        self.region = client.region()
        self.rows: Any = torch.frombuffer(self.region._mm, dtype=torch.int8)
        self.base = self.rows.data_ptr()
        self.stride = self.region.row_stride
        self.shard_bytes = self.region.shard_bytes
        self.epoch = int(client.info["event_epoch"])
        self.pinned = False
        if pin:
            rv = torch.cuda.cudart().cudaHostRegister(self.base, self.rows.numel(), 0)
            if int(rv) != 0:
                self.close()
                raise RuntimeError(f"kvpool: cudaHostRegister of the region failed ({rv})")
            self.pinned = True

    def close(self) -> None:
        """Unpins and unmaps (the client is the caller's)."""
        if self.pinned:
            self._torch.cuda.cudart().cudaHostUnregister(self.base)
            self.pinned = False
        self.rows = None
        try:
            self.region.close()
        except BufferError:
            pass  # a view of it is still alive: the mapping goes with the last one


class PageCopier:
    """One worker's pages. tensors: its KV cache tensors, all on the CPU or
    all on one GPU; layout[g]: for group g, (tensor index, page bytes,
    offset in the row's shard) of each of its layer tensors; rank: the
    worker's shard of each row."""

    def __init__(self, tensors: Sequence[Any], layout: Sequence[Sequence[tuple[int, int, int]]],
                 rank: int = 0, threads: int = 0):
        self.tensors = list(tensors)
        self.layout = [list(g) for g in layout]
        self.rank = rank
        self.threads = threads or min(8, os.cpu_count() or 1)
        self.cuda = any(t.is_cuda for t in self.tensors)
        for g, lay in enumerate(self.layout):
            for t, page, _ in lay:
                if not 0 <= t < len(self.tensors):
                    raise ValueError(f"kvpool: group {g} names tensor {t} of "
                                     f"{len(self.tensors)}")
                ten = self.tensors[t]
                if ten.element_size() != 1 or ten.dim() != 2:
                    raise ValueError(f"kvpool: tensor {t} is not vLLM's canonical (blocks, "
                                     "bytes) int8 view")
                if page > ten.stride(0):
                    raise ValueError(f"kvpool: tensor {t}'s page of {page} bytes is larger "
                                     "than its block")

    def shard_need(self) -> int:
        """Bytes of a row's shard the largest group uses."""
        return max((off + page for lay in self.layout for _, page, off in lay), default=0)

    def copy(self, m: RegionMap, group: int, blocks: np.ndarray, rows: np.ndarray,
             store: bool) -> int:
        """Copies group's pages of blocks to (store) or from their rows; returns
        the bytes. CPU tensors are copied when it returns (one C call over
        this host's cores); CUDA pages are queued on the current stream (the
        region must be pinned), done when the caller's event on it is."""
        if m.shard_bytes < self.shard_need() or len(blocks) != len(rows):
            raise ValueError("kvpool: the region's shard cannot hold these pages, or the "
                             "blocks and rows differ in number")
        rows = np.asarray(rows, dtype=np.int64)
        blocks = np.asarray(blocks, dtype=np.int64)
        shard = self.rank * m.shard_bytes
        if self.cuda:
            return self._copy_cuda(m, group, blocks, rows, shard, store)
        dst, src, lens, nbytes = [], [], [], 0
        for t, page, off in self.layout[group]:
            ten = self.tensors[t]
            rowp = m.base + rows * m.stride + shard + off
            blkp = ten.data_ptr() + blocks * ten.stride(0)
            dst.append(rowp if store else blkp)
            src.append(blkp if store else rowp)
            lens.append(np.full(len(rows), page, dtype=np.uint64))
            nbytes += page * len(rows)
        if not dst:
            return 0
        d = np.concatenate(dst).astype(np.uint64)
        s = np.concatenate(src).astype(np.uint64)
        ln = np.concatenate(lens)
        rv = L.kvp_copy_many(d.ctypes.data, s.ctypes.data, ln.ctypes.data, len(d), self.threads)
        if rv != 0:
            raise RuntimeError(f"kvpool: kvp_copy_many failed ({rv})")
        return nbytes

    def _copy_cuda(self, m: RegionMap, group: int, blocks: np.ndarray, rows: np.ndarray,
                   shard: int, store: bool) -> int:
        """Each page between device memory and its pinned row (DMA; a batched
        kernel would launch less)."""
        if not m.pinned:
            raise ValueError("kvpool: CUDA copies need the region pinned (RegionMap(pin=True))")
        nbytes = 0
        for block, row in zip(blocks.tolist(), rows.tolist()):
            base = row * m.stride + shard
            for t, page, off in self.layout[group]:
                host = m.rows[base + off:base + off + page]
                dev = self.tensors[t][block, :page]
                (host if store else dev).copy_(dev if store else host, non_blocking=True)
                nbytes += page
        return nbytes
