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

import ctypes
import logging
import math
import mmap
import os
from typing import Any, Optional, Sequence

import numpy as np

import kvpool
from kvpool import _lib as L

__all__ = ["RegionMap", "PageCopier", "cuda_batch"]
_log = logging.getLogger("kvpool")


class _Attrs(ctypes.Structure):
    """cudaMemcpyAttributes: srcAccessOrder, srcLocHint, dstLocHint, flags."""
    _fields_ = [("order", ctypes.c_int), ("src_type", ctypes.c_int), ("src_id", ctypes.c_int),
                ("dst_type", ctypes.c_int), ("dst_id", ctypes.c_int), ("flags", ctypes.c_uint)]


_STREAM, _ANY = 1, 3  # cudaMemcpySrcAccessOrderStream, ...Any


class _CudaBatch:
    """cudaMemcpyBatchAsync of the CUDA runtime torch loaded (12.8 or later):
    every page of a job in one call, carried by the copy engines, as vLLM's
    own CPU tier does (its swap_blocks_batch). 13.x dropped 12.x's failIdx."""

    def __init__(self, rt: "_Runtime"):
        self.rt = rt
        self.fn = rt.lib.cudaMemcpyBatchAsync
        self.fn.restype = ctypes.c_int

    def __call__(self, dst: np.ndarray, src: np.ndarray, lens: np.ndarray, stream: int,
                 src_any: bool) -> None:
        if stream == 0:
            raise ValueError("kvpool: batched copies need a stream other than the legacy "
                             "default stream")
        attrs = _Attrs(_ANY if src_any else _STREAM, 0, 0, 0, 0, 0)
        idx = ctypes.c_size_t(0)
        args: list[Any] = [ctypes.c_void_p(dst.ctypes.data), ctypes.c_void_p(src.ctypes.data),
                           ctypes.c_void_p(lens.ctypes.data), ctypes.c_size_t(len(dst)),
                           ctypes.byref(attrs), ctypes.byref(idx), ctypes.c_size_t(1)]
        fail = ctypes.c_size_t(0)
        if self.rt.version < 13000:
            args.append(ctypes.byref(fail))
        rv = self.fn(*args, ctypes.c_void_p(stream))
        if rv != 0:
            raise RuntimeError(f"kvpool: cudaMemcpyBatchAsync of {len(dst)} pages failed: "
                               f"{self.rt.failed(rv)}")


class _Runtime:
    """The CUDA runtime library torch loaded, through ctypes: its errors are
    read (and cleared) here, so a failed call leaves torch nothing stale."""

    def __init__(self, lib: ctypes.CDLL, version: int):
        self.lib, self.version = lib, version
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]

    def failed(self, rv: int) -> str:
        """rv's name, the runtime's last error consumed."""
        self.lib.cudaGetLastError()
        return f"{self.lib.cudaGetErrorString(rv).decode(errors='replace')} ({rv})"


_runtime: Any = None  # unresolved; False: none found


def _loaded_cudart() -> list[str]:
    """Paths of the libcudart this process has loaded (torch's), newest first."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            found = {ln.split()[-1] for ln in f if "libcudart.so" in ln}
    except OSError:
        found = set()
    return sorted(found, reverse=True) + ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]


def _cuda_runtime() -> Optional[_Runtime]:
    global _runtime
    if _runtime is None:
        _runtime = False
        for path in _loaded_cudart():
            try:
                lib = ctypes.CDLL(path)
                ver = ctypes.c_int(0)
                if lib.cudaRuntimeGetVersion(ctypes.byref(ver)) != 0:
                    continue
            except (OSError, AttributeError):
                continue
            _runtime = _Runtime(lib, ver.value)
            break
    return _runtime or None


def cuda_batch() -> Optional[_CudaBatch]:
    """The batched copy of the CUDA runtime in this process, or None (no
    runtime, or one before 12.8): then pages are copied one copy_ each."""
    rt = _cuda_runtime()
    if rt is None or rt.version < 12080 or not hasattr(rt.lib, "cudaMemcpyBatchAsync"):
        return None
    return _CudaBatch(rt)


_BATCH_PAGES = 128  # pages per cudaMemcpyBatchAsync (measured on an H100: BENCHMARKS.md)
_PIN_CHUNK = 64 << 30  # bytes per cudaHostRegister, as vLLM registers its region
# Pages smaller than this go by GPU threads (kvpool._page_kernel) rather than
# the copy engines, where the region is pinned and Triton is installed: on an
# H200, 2-3x the engines' rate at 8-32 KiB, level at 64 KiB, where the engines
# keep the work (they take no SMs from the model). 16 programs (an eighth of
# an H100's SMs) reach all but a few percent of what 32 to 132 do (docs/vllm.md).
_KERNEL_BELOW = 64 << 10
_KERNEL_PROGRAMS = 16
_kernel: Any = None  # unresolved; False: not usable in this process


def _page_kernel(device: int) -> Any:
    """kvpool._page_kernel where GPU threads can reach registered host memory
    by its address and Triton imports; else None (the reason logged once)."""
    global _kernel
    if _kernel is None:
        _kernel = False
        rt, ok = _cuda_runtime(), ctypes.c_int(0)
        # cudaDevAttrCanUseHostPointerForRegisteredMem
        if rt is None or rt.lib.cudaDeviceGetAttribute(ctypes.byref(ok), 91, device) != 0 \
                or not ok.value:
            if rt is not None:
                rt.lib.cudaGetLastError()
            _log.info("kvpool: small pages go by the copy engines: the GPU cannot reach "
                      "registered host memory by its address")
            return None
        try:
            from kvpool import _page_kernel as k
        except Exception as e:  # ImportError, or Triton finding no usable backend
            _log.info("kvpool: small pages go by the copy engines: no Triton (%s)", e)
            return None
        _kernel = k
    return _kernel or None


def _kernel_failed(e: Exception) -> None:
    """The page kernel failed before it copied anything: no more tries."""
    global _kernel
    _kernel = False
    _log.warning("kvpool: the page kernel failed (%s); small pages go by the copy engines", e)


class RegionMap:
    """The region of the pool `client` is connected to, mapped as an int8
    tensor. With `pin`, registered with CUDA (page-locked) for DMA; where
    the kernel refuses (the region's file is not on a tmpfs such as
    /dev/shm, or a hugetlbfs: Linux pins no other file's pages for long)
    it stays pageable, copies still right but slower, and a warning says
    why. epoch is the pool's life (Hello's event_epoch): each kvpoold start
    has a new region file. With `ref` (a RegionRef another process of this
    host holds, and the life it belongs to), that region is mapped through
    the holder's descriptor instead, with no call to kvpoold (client None)."""

    def __init__(self, client: Optional[kvpool.Client], pin: bool = False,
                 ref: Optional[tuple[kvpool.RegionRef, int]] = None):
        import torch
        self.client = client
        if ref is not None:
            self.region: Any = kvpool.adopt_region(ref[0])
            self.epoch = int(ref[1])
        elif client is not None:
            self.region = client.region()
            self.epoch = int(client.info["event_epoch"])
        else:
            raise ValueError("kvpool: RegionMap needs a client or a region's ref")
        self.rows: Any = torch.frombuffer(self.region._mm, dtype=torch.int8)
        self.base = self.rows.data_ptr()
        self.stride = self.region.row_stride
        self.shard_bytes = self.region.shard_bytes
        self._pinned: list[int] = []
        self._rt: Optional[_Runtime] = None
        if pin:
            self._pin(torch)

    @property
    def pinned(self) -> bool:
        return bool(self._pinned)

    def _pin(self, torch: Any) -> None:
        """Registers the region in chunks that end on rows and pages (no copy
        spans two, no page is registered twice), all or none."""
        torch.cuda.init()  # loads the runtime this process shares with torch
        rt = self._rt = _cuda_runtime()
        total = self.rows.numel()
        why = "no CUDA runtime found in this process"
        if rt is not None:
            unit = math.lcm(self.stride, mmap.PAGESIZE)
            chunk = max(_PIN_CHUNK // unit, 1) * unit
            for off in range(0, total, chunk):
                rv = rt.lib.cudaHostRegister(self.base + off, min(chunk, total - off), 0)
                if rv != 0:
                    why = rt.failed(rv)
                    self._unpin()
                    break
                self._pinned.append(self.base + off)
        if not self._pinned:
            _log.warning("kvpool: the region (%.1f MiB) could not be pinned for CUDA: %s; copies "
                         "go through pageable memory, slower. kvpoold's region-dir on a tmpfs "
                         "(/dev/shm) or hugetlbfs can be pinned", total / 2**20, why)

    def _unpin(self) -> None:
        rt, addrs, self._pinned = self._rt, self._pinned, []
        for a in reversed(addrs):
            if rt is not None:
                rt.lib.cudaHostUnregister(a)

    def close(self) -> None:
        """Unpins and unmaps (the client is the caller's)."""
        self._unpin()
        self.rows = None
        try:
            self.region.close()
        except BufferError:
            pass  # a view of it is still alive: the mapping goes with the last one


class PageCopier:
    """One worker's pages. tensors: its KV cache tensors, all on the CPU or
    all on one GPU; layout[g]: for group g, (tensor index, page bytes,
    offset in the row's shard) of each of its layer tensors; rank: the
    worker's shard of each row; batched: CUDA pages by
    cudaMemcpyBatchAsync (False: one copy_ each, slower); kernel: CUDA pages
    by GPU threads, into and out of a pinned region (None: a group's pages
    when all are smaller than _KERNEL_BELOW; True: every group's; False:
    never), where the GPU and Triton allow it, else by the engines."""

    def __init__(self, tensors: Sequence[Any], layout: Sequence[Sequence[tuple[int, int, int]]],
                 rank: int = 0, threads: int = 0, batched: bool = True,
                 kernel: Optional[bool] = None):
        self.tensors = list(tensors)
        self.layout = [list(g) for g in layout]
        self.rank = rank
        self.threads = threads or min(8, os.cpu_count() or 1)
        self.cuda = any(t.is_cuda for t in self.tensors)
        if kernel and not self.cuda:
            raise ValueError("kvpool: the page kernel copies CUDA tensors only")
        self.batch = cuda_batch() if self.cuda and batched else None
        self.kernel_mode = kernel
        # pages copied so far by each way: the page kernel, the engines'
        # batches, a copy_ each, or the host's cores (kvp_copy_many)
        self.pages_by = {"kernel": 0, "batched": 0, "copy_": 0, "host": 0}
        if self.cuda:
            import torch
            self._stream = torch.cuda.current_stream
            self._torch = torch
        for g, lay in enumerate(self.layout):
            for t, page, off in lay:
                if page <= 0 or off < 0:
                    raise ValueError(f"kvpool: group {g} has a page of {page} bytes at "
                                     f"offset {off}")
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
        # per group: its tensors' addresses and block strides, pages, offsets
        self._groups = [(np.array([self.tensors[t].data_ptr() for t, _, _ in lay], np.int64),
                         np.array([self.tensors[t].stride(0) for t, _, _ in lay], np.int64),
                         np.array([p for _, p, _ in lay], np.uint64),
                         np.array([o for _, _, o in lay], np.int64)) for lay in self.layout]

    def shard_need(self) -> int:
        """Bytes of a row's shard the largest group uses."""
        return max((off + page for lay in self.layout for _, page, off in lay), default=0)

    def copy(self, m: RegionMap, group: int, blocks: np.ndarray, rows: np.ndarray,
             store: bool) -> int:
        """Copies group's pages of blocks to (store) or from their rows; returns
        the bytes. CPU tensors are copied when it returns (one C call over
        this host's cores); CUDA pages are queued on the current stream, by
        the page kernel or in batched calls (asynchronous where the region
        is pinned), done when the caller's event on it is."""
        if m.shard_bytes < self.shard_need() or len(blocks) != len(rows):
            raise ValueError("kvpool: the region's shard cannot hold these pages, or the "
                             "blocks and rows differ in number")
        rows = np.asarray(rows, dtype=np.int64)
        blocks = np.asarray(blocks, dtype=np.int64)
        shard = self.rank * m.shard_bytes
        batch = self.batch
        ptrs, strides, pages, offs = self._groups[group]
        if not len(ptrs) or not len(rows):
            return 0
        kernel = self._kernel_for(group) if self.cuda and m.pinned else None
        if self.cuda and batch is None and kernel is None:
            return self._copy_pages(m, group, blocks, rows, shard, store)
        # (layer, block) pairs, layer-major: every page's two addresses and length
        rowp = m.base + shard + offs[:, None] + (rows * m.stride)[None, :]
        blkp = ptrs[:, None] + strides[:, None] * blocks[None, :]
        d = (rowp if store else blkp).ravel().astype(np.uint64)
        s = (blkp if store else rowp).ravel().astype(np.uint64)
        ln = np.repeat(pages, len(rows))
        nbytes = int(ln.sum())
        if kernel is not None and not ((d | s | ln) & np.uint64(7)).any():
            # Its 8-byte loads and stores need 8-byte aligned pages.
            desc = np.concatenate([d.view(np.int64), s.view(np.int64),
                                   (ln >> np.uint64(3)).astype(np.int64)])
            dev = self._torch.from_numpy(desc).pin_memory().to(self.tensors[0].device,
                                                                non_blocking=True)
            try:
                kernel.launch(dev, len(d), _KERNEL_PROGRAMS, int(pages.max()))
                self.pages_by["kernel"] += len(d)
                return nbytes
            except Exception as e:  # Triton could not build or launch it: the engines copy
                _kernel_failed(e)
        if self.cuda and batch is None:  # pages the kernel cannot take, no batched copy
            return self._copy_pages(m, group, blocks, rows, shard, store)
        if batch is not None:
            # Loads read rows nothing writes meanwhile: the engines may read
            # them out of stream order (vLLM's loads do the same). A batch's
            # submission costs ~0.4 us a page before its first byte moves:
            # in slices, the engines copy one while the next is submitted.
            stream = self._stream().cuda_stream
            for i in range(0, len(d), _BATCH_PAGES):
                j = i + _BATCH_PAGES
                batch(d[i:j], s[i:j], ln[i:j], stream, src_any=not store)
            self.pages_by["batched"] += len(d)
            return nbytes
        rv = L.kvp_copy_many(d.ctypes.data, s.ctypes.data, ln.ctypes.data, len(d), self.threads)
        if rv != 0:
            raise RuntimeError(f"kvpool: kvp_copy_many failed ({rv})")
        self.pages_by["host"] += len(d)
        return nbytes

    def _kernel_for(self, group: int) -> Any:
        """The page kernel, where this group's pages go by it; else None."""
        if self.kernel_mode is False or (self.kernel_mode is None and
                                         int(self._groups[group][2].max()) >= _KERNEL_BELOW):
            return None
        return _page_kernel(self.tensors[0].device.index or 0)

    def _copy_pages(self, m: RegionMap, group: int, blocks: np.ndarray, rows: np.ndarray,
                    shard: int, store: bool) -> int:
        """Each page between device memory and its row, one copy_ each:
        where the runtime has no cudaMemcpyBatchAsync."""
        nbytes = 0
        for block, row in zip(blocks.tolist(), rows.tolist()):
            base = row * m.stride + shard
            for t, page, off in self.layout[group]:
                host = m.rows[base + off:base + off + page]
                dev = self.tensors[t][block, :page]
                (host if store else dev).copy_(dev if store else host, non_blocking=True)
                nbytes += page
                self.pages_by["copy_"] += 1
        return nbytes
