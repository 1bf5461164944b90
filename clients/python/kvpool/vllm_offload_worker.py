# SPDX-License-Identifier: Apache-2.0
"""The worker side of kvpool's offloading tier (kvpool.vllm_offload): copies
between vLLM's KV cache tensors and kvpoold's region rows."""
from __future__ import annotations

import threading
import time
from typing import Any, Optional

import numpy as np

from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (CanonicalKVCaches, GPULoadStoreSpec, LoadStoreSpec,
                                     OffloadingWorker, TransferResult)
from vllm.v1.kv_offload.config import OffloadingConfig

import kvpool
from kvpool._offload_tier import KVPoolRowsSpec, _check_tier, _connect
from kvpool.kv_copy import PageCopier, RegionMap

logger = init_logger(__name__)


class KVPoolOffloadingWorker(OffloadingWorker):
    """Copies between vLLM's KV cache tensors and this worker's shard of
    kvpoold's region rows (kvpool.kv_copy). CPU tensors are copied when
    submitted; CUDA tensors on a side stream, after the model's stream, by
    cudaMemcpyBatchAsync (as vLLM's own CPU tier) to and from the pinned
    region, completed by event.

    A restarted kvpoold has a new region (another file): a job names its
    pool life (KVPoolRowsSpec.epoch), and the worker maps the new region the
    first time a job names it, keeping the one before for the jobs issued
    before the scheduler renewed its session. It maps it through the
    scheduler's descriptor (KVPoolRowsSpec.region), with no call to kvpoold,
    so a HIT granted by a kvpoold that died before this step still loads
    the right bytes; only where that cannot be had (another user, no /proc)
    does it ask kvpoold, for at most kvpool_timeout_ms once. A job whose
    region cannot be had is never run against other rows: a store is done
    with nothing written, a load reported failed (which vLLM 0.33 turns
    into the engine's end: the descriptor is what keeps that from
    happening)."""

    def __init__(self, extra: dict[str, Any], config: OffloadingConfig,
                 kv_caches: CanonicalKVCaches):
        import torch
        self._torch = torch
        self._extra, self._config = dict(extra), config
        self._name = f"vllm-worker {config.engine_id}/{config.parallel.rank}"
        # per group: (tensor index, page bytes, offset in the shard)
        layout = []
        for refs in kv_caches.group_data_refs:
            off, lay = 0, []
            for ref in refs:
                lay.append((ref.tensor_idx, ref.page_size_bytes, off))
                off += ref.page_size_bytes
            layout.append(lay)
        self._copier = PageCopier([t.tensor for t in kv_caches.tensors], layout,
                                  rank=config.parallel.rank)
        self._cuda = self._copier.cuda
        self._stream = torch.cuda.Stream() if self._cuda else None
        self._maps: list[RegionMap] = [self._map()]  # newest last; at most two
        # (job, CUDA event, or None: done, or False: not run; bytes, start, its map)
        self._inflight: list[tuple[int, Any, int, float, Optional[RegionMap]]] = []
        self._lock = threading.Lock()

    # ---- the region of each pool life ----
    def _map(self, timeout_ms: Optional[int] = None, retries: int = 2) -> RegionMap:
        """A session with the pool as it runs now, and its region mapped."""
        client = _connect(self._extra, self._name, timeout_ms=timeout_ms or 5000, retries=retries)
        try:
            _check_tier(client, self._config, 1, self._copier.shard_need())
            return RegionMap(client, pin=self._cuda)
        except BaseException:
            client.close()
            raise

    def _unmap(self, m: RegionMap) -> None:
        m.close()
        if m.client is None:
            return
        try:
            m.client.close()
        except kvpool.KvpoolError:
            pass  # its kvpoold is gone: so is the session

    def _mapping(self, epoch: Optional[int],
                 ref: Optional[kvpool.RegionRef] = None) -> Optional[RegionMap]:
        """The mapping of the pool life epoch names (None: the newest): a new
        life's region mapped through ref, else through the running kvpoold;
        None if it cannot be had."""
        for m in reversed(self._maps):
            if epoch is None or m.epoch == epoch:
                return m
        new = None
        if ref is not None and epoch is not None:
            try:
                new = RegionMap(None, pin=self._cuda, ref=(ref, epoch))
            except (OSError, ValueError) as e:
                logger.warning("kvpool: cannot map pool life %#x's region through the "
                               "scheduler's descriptor (%s): asking kvpoold", epoch, e)
        if new is None:
            try:
                # One short try: this runs inside an engine step.
                new = self._map(timeout_ms=int(self._extra.get("kvpool_timeout_ms", 1000)),
                                retries=0)
            except kvpool.KvpoolError as e:
                logger.error("kvpool: a transfer names pool life %#x, and kvpoold does not "
                             "answer (%s): not copied (a load fails, a store is dropped)",
                             epoch, e)
                return None
        if any(m.epoch == new.epoch for m in self._maps):
            self._unmap(new)  # kvpoold has not restarted: epoch names no life of it we can map
        else:
            with self._lock:
                # Keep the newest two; an older one goes once its CUDA jobs are done.
                old = self._maps[:-1]
                self._maps = self._maps[-1:] + [new]
                events = [ev for _, ev, _, _, jm in self._inflight
                          if any(jm is m for m in old) and ev is not None and ev is not False]
            for ev in events:
                ev.synchronize()
            for m in old:
                self._unmap(m)
        if new.epoch != epoch:
            logger.error("kvpool: a transfer names pool life %#x, whose region is gone (kvpoold "
                         "now runs %#x): not copied (a load fails, a store is dropped)", epoch,
                         new.epoch)
            return None
        return new

    def _run(self, job_id: int, gpu: GPULoadStoreSpec, spec: KVPoolRowsSpec, store: bool) -> bool:
        """One job: per group, every page of its blocks to or from this worker's
        slice of their rows (rows -1, stores only: nothing to write)."""
        torch = self._torch
        t0 = time.perf_counter()
        nbytes = 0
        rows = np.asarray(spec.rows, dtype=np.int64)
        blocks = np.asarray(gpu.block_ids, dtype=np.int64)
        if not store and (rows <= 0).any():
            raise RuntimeError(f"kvpool: load job {job_id} has a block with no row")
        m = self._mapping(getattr(spec, "epoch", None), getattr(spec, "region", None))
        if m is None:
            # Nothing copied. A load fails: its blocks hold no KV. A store is
            # done: its rows went with that pool life, so nothing it would have
            # written can be seen, and vLLM 0.33 ends the engine on any failed
            # job (it asserts).
            with self._lock:
                self._inflight.append((job_id, None if store else False, 0, t0, None))
            return True
        stream_ctx: Any = _nullctx()
        if self._stream is not None:
            # After what the model's stream has queued: a store reads KV the
            # forward pass writes, a load writes blocks it may be zeroing.
            self._stream.wait_stream(torch.cuda.current_stream())
            stream_ctx = torch.cuda.stream(self._stream)
        with stream_ctx:
            start = 0
            for g, n in enumerate(gpu.group_sizes):
                r, b = rows[start:start + n], blocks[start:start + n]
                start += n
                keep = r > 0
                if len(r) and keep.any():
                    nbytes += self._copier.copy(m, g, b[keep], r[keep], store)
        event: Any = None
        if self._cuda:
            event = torch.cuda.Event()
            event.record(self._stream)
        with self._lock:
            self._inflight.append((job_id, event, nbytes, t0, m))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._run(job_id, src_spec, dst_spec, True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        return self._run(job_id, dst_spec, src_spec, False)

    def get_finished(self) -> list[TransferResult]:
        """Jobs done since the last call; event False: a job not run (its region is gone)."""
        out = []
        with self._lock:
            keep = []
            for job_id, event, nbytes, t0, m in self._inflight:
                if event is None or event is False or event.query():
                    out.append(TransferResult(job_id=job_id, success=event is not False,
                                              transfer_size=nbytes,
                                              transfer_time=time.perf_counter() - t0))
                else:
                    keep.append((job_id, event, nbytes, t0, m))
            self._inflight = keep
        return out

    def wait(self, job_ids: set[int]) -> None:
        with self._lock:
            events = [e for j, e, _, _, _ in self._inflight
                      if j in job_ids and e is not None and e is not False]
        for e in events:
            e.synchronize()

    def shutdown(self) -> None:
        self.wait({j for j, _, _, _, _ in self._inflight})
        maps, self._maps = self._maps, []
        for m in maps:
            self._unmap(m)


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
