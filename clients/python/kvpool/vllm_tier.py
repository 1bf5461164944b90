# SPDX-License-Identifier: Apache-2.0
"""kvpool as a secondary tier under vLLM 0.33's own tiering
(TieringOffloadingSpec): each engine keeps its private CPU primary tier, and
this tier under it spills chunks into, and promotes them from, the node's
shared kvpool region, so a chunk one engine spilled is a hit for another.

    vllm serve MODEL --kv-transfer-config '{
      "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8589934592,
        "secondary_tiers": [{"type": "KVPoolSecondaryTier",
                             "module_path": "kvpool.vllm_tier",
                             "kvpool_url": "ipc:///run/kvpool/kvpool.ipc",
                             "kvpool_pool": "tier"}]}}'

vLLM's factory imports module_path, takes the class "type" names from it
and passes the tier's other keys as keyword arguments (kvpool_url, kvpool_pool, kvpool_token, kvpool_token_file,
kvpool_timeout_ms; and vLLM's own enable_kv_events, locality and backpressure,
as its fs tier takes them). The pool's rows must be the primary tier's chunks, byte
for byte (checked at start, naming both sizes).

The scheduler's calls never wait on a copy: lookup answers from what the
last step's end locked (a key not asked about yet answers RETRY, and is
looked up, its hit locked, in one round trip at on_schedule_end); loads and
stores copy on threads of their own (four for stores, four for loads),
between the primary tier's memory and region rows, with no socket on the data path (the region is this host's
memory). A store reserves and commits on an idle writer session of the
tier's (a reservation belongs to the session that made it); a key someone else stored
meanwhile is skipped. Every error of the tier is a miss or a skipped store
(JobResult success False), with a warning a minute, never an exception into
vLLM's scheduler.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar, Iterable, Optional

import numpy as np
from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (Locality, LookupResult, Medium, OffloadingEvent,
                                     OffloadKey, ReqContext,
                                     RequestOffloadingContext, ScheduleEndContext)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

import kvpool
from kvpool._offload_tier import _connect

logger = init_logger(__name__)
_ERROR_LOG_S = 60.0  # one warning a minute for a tier that does not answer
_KEEP_STEPS = 2      # a lock no lookup or load used for this many steps is released
_FILLING = -2        # a lookup's row while the pool's cluster tier fills the key
_BACKOFF_S, _BACKOFF_MAX_S = 0.5, 5.0  # between tries at a tier that does not answer
_LOAD_THREADS = 4
_STORE_THREADS = 4  # each with a writer session of its own: round trips overlap


class _Down(Exception):
    """kvpoold did not answer in time: this step goes on without the tier."""

__all__ = ["KVPoolSecondaryTier"]


class KVPoolSecondaryTier(SecondaryTierManager):
    """vLLM 0.33's SecondaryTierManager over one kvpoold pool's region (see
    the module's doc). Not thread-safe beyond what the base class promises:
    vLLM calls it under its tiering manager's lock; its copy thread only
    touches rows, the primary tier's memory and its own session."""

    medium: ClassVar[Medium] = Medium.CPU

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, locality: Any = None,
                 enable_kv_events: bool = False, **extra: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        unknown = sorted(k for k in extra if not k.startswith("kvpool_"))
        if unknown:
            raise ValueError(f"kvpool: secondary tier {tier_type!r}: unknown settings "
                             f"{unknown} (kvpool_url, kvpool_pool, kvpool_token, "
                             "kvpool_token_file, kvpool_timeout_ms, enable_kv_events, "
                             "locality, backpressure)")
        self.locality = Locality(locality) if locality is not None else None
        # Stored chunks as vLLM's fs tier reports them (enable_kv_events, with
        # the engine's KV events on): the node credited with each key.
        self._events: Optional[list[OffloadingEvent]] = None
        self._store_keys: dict[int, list[OffloadKey]] = {}
        if enable_kv_events:
            kv_events = getattr(offloading_spec, "kv_events_config", None)
            if kv_events is not None and kv_events.enable_kv_cache_events:
                self._events = []
            else:
                logger.warning("kvpool secondary tier %r: enable_kv_events is set but the "
                               "engine's KV cache events are off; no events", tier_type)
        primary = np.asarray(primary_kv_view)
        self._primary = primary.reshape(primary.shape[0], -1).view(np.uint8)
        # Both sessions answer within kvpool_timeout_ms (1 s) or not at all.
        self._name = f"vllm-tier {tier_type}"
        self._client = _connect(extra, self._name, timeout_ms=1000, retries=0)
        self._writers: queue.SimpleQueue[kvpool.Client] = queue.SimpleQueue()
        self._all_writers: list[kvpool.Client] = []
        # Each pool life's region (by event epoch), mapped while a row of it
        # is locked or being copied: after a kvpoold restart the rows a new
        # session hands out are the new life's, and copies from the old
        # mapping would move other bytes.
        self._regions: dict[int, kvpool.Region] = {}
        self._regions_lock = threading.Lock()
        self._store_pins: Counter[int] = Counter()  # lives a store is copying into
        try:
            region = self._life_region(self._client)
            if region.row_bytes != self.block_size_bytes:
                raise ValueError(
                    f"kvpool: pool {self._client.info['pool']!r} has rows of "
                    f"{region.row_bytes} bytes, vLLM's primary tier chunks of "
                    f"{self.block_size_bytes}: size the pool's layout to the chunk")
            for i in range(_STORE_THREADS):
                w = _connect(extra, f"{self._name} writer {i}", timeout_ms=1000, retries=0)
                self._all_writers.append(w)
                self._writers.put(w)
        except BaseException:
            self._close_regions(keep=())
            for c in (*self._all_writers, self._client):
                c.close()
            raise
        self._key_len = self._client.key_len
        # Stores on several threads (each job takes an idle writer session),
        # loads on several (they only copy); numpy copies without the GIL.
        self._storer = ThreadPoolExecutor(max_workers=_STORE_THREADS,
                                          thread_name_prefix="kvpool-tier-st")
        self._loader = ThreadPoolExecutor(max_workers=_LOAD_THREADS,
                                          thread_name_prefix="kvpool-tier-ld")
        self._futures: set[Future] = set()
        self._done: list[JobResult] = []
        self._done_lock = threading.Lock()
        self._step = 0
        self._rows: dict[OffloadKey, tuple[int, int]] = {}  # locked key -> (row, life)
        self._used: dict[OffloadKey, int] = {}   # locked key -> the last step that used it
        self._loading: Counter[OffloadKey] = Counter()
        self._asked: dict[OffloadKey, None] = {}  # to look up at the step's end
        self._missed: set[OffloadKey] = set()     # misses found at the last step's end
        self._loads: dict[int, tuple[int, list[OffloadKey]]] = {}  # job -> (life, keys)
        self._life_loads: Counter[int] = Counter()
        self._down_until = 0.0
        self._backoff = _BACKOFF_S
        self._suspect = False  # a call failed: renew the session before the next one
        self._last_warning = 0.0
        self._batch: Optional[kvpool.Batch] = None  # the step's calls, reused step after step

    # ---- lookups: answered from the last step's end ----
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._rows:
            self._used[key] = self._step
            return LookupResult.HIT
        if key in self._missed or len(key) != self._key_len:
            return LookupResult.MISS
        self._asked[key] = None
        return LookupResult.RETRY

    def touch(self, keys: Any, req_context: ReqContext) -> None:
        for k in keys:
            if k in self._rows:
                self._used[k] = self._step

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """One round trip, none on a step with nothing to ask: lock what
        this step asked about and release the locks no lookup or load used
        for _KEEP_STEPS steps, in one Batch."""
        self._step += 1
        asked, self._asked = list(self._asked), {}
        stale = [k for k, s in self._used.items()
                 if self._step - s > _KEEP_STEPS and not self._loading[k]]
        missed: set[OffloadKey] = set()
        res: dict[str, tuple[Optional[kvpool.KvpoolError], list[int]]] = {}

        def step(c: kvpool.Client) -> None:
            held = [k for k in stale if k in self._rows]  # none of an old life after a renew
            if self._batch is None:
                self._batch = c.batch(keep_going=True)
            b = self._batch
            b.clear()
            kinds = []
            if held:
                b.unlock(held)
                kinds.append("unlock")
            if asked:
                b.lookup_and_lock(asked)
                kinds.append("lookup")
            if kinds:
                res.update(zip(kinds, b.send_rows()))
        if stale or asked:
            try:
                life = self._call(step)
                for k in stale:
                    self._rows.pop(k, None)
                    self._used.pop(k, None)
                for kind, (err, _) in res.items():
                    if err is not None:  # the session's locks are in doubt: renew it
                        self._suspect = True
                        self._warn(kind, err)
                err, rows = res.get("lookup", (None, []))
                if err is not None:
                    missed.update(asked)
                for k, r in zip(asked, rows):
                    if r > 0:
                        self._rows[k] = (r, life)
                        self._used[k] = self._step
                    elif r != _FILLING:
                        missed.add(k)
            except (_Down, kvpool.KvpoolError) as e:
                if isinstance(e, kvpool.KvpoolError):
                    self._suspect = True
                    self._warn("lookup", e)
                missed.update(asked)
        self._missed = missed
        if len(self._regions) > 1:  # a restart left an old life mapped: unmap it once unused
            self._close_regions(keep=self._lives_in_use())

    # ---- the session: renewed when kvpoold lost it; an outage is a miss ----
    def _call(self, fn: Any) -> int:
        """fn(client), then the pool life the session is in; _Down while
        kvpoold does not answer (a backoff of 0.5 s doubling to 5 s, so an
        outage costs a step one timeout per backoff, not one per call)."""
        if time.monotonic() < self._down_until:
            raise _Down()
        # A renewal ends the old session's locks: not while a load still
        # copies from a row one of them holds (a copy takes microseconds;
        # the step goes on without the tier meanwhile).
        if self._suspect and self._loading:
            raise _Down()
        try:
            if self._suspect:
                self._renew()
            try:
                fn(self._client)
            except kvpool.Unauthenticated:  # its lease ran out, or kvpoold restarted
                self._renew()
                fn(self._client)
        except (kvpool.Busy, kvpool.Unavailable, kvpool.DeadlineExceeded) as e:
            self._suspect = True
            self._down_until = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, _BACKOFF_MAX_S)
            self._warn("a call", e)
            raise _Down() from e
        self._backoff = _BACKOFF_S
        return self._life_of(self._client)

    def _renew(self) -> None:
        """A new session. The old one's locks ended with it (the Hello that
        renews names it), in this pool life or the last: every row it held
        is forgotten, or its unlock would fail every step after."""
        self._client.renew()
        self._suspect = False
        self._rows.clear()
        self._used.clear()
        self._life_of(self._client)

    def _life_of(self, c: kvpool.Client) -> int:
        """c's pool life, its region mapped."""
        self._life_region(c)
        return int(c.info["event_epoch"])

    def _life_region(self, c: kvpool.Client) -> kvpool.Region:
        life = int(c.info["event_epoch"])
        with self._regions_lock:
            r = self._regions.get(life)
            if r is None:
                r = self._regions[life] = c.region()
            return r

    def _lives_in_use(self) -> set[int]:
        lives = {lf for _, lf in self._rows.values()} | set(self._life_loads)
        lives.add(int(self._client.info["event_epoch"]))
        return lives

    def _close_regions(self, keep: Any) -> None:
        """Unmaps the lives not in keep that no store is copying into."""
        with self._regions_lock:
            for life in [lf for lf in self._regions if lf not in keep and
                         not self._store_pins[lf]]:
                self._regions.pop(life).close()

    # ---- transfers: copies on the tier's own thread ----
    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        held = [self._rows.get(k) for k in keys]
        lives = {h[1] for h in held if h is not None}
        if None in held or len(lives) != 1:  # a key this engine does not hold: no copy
            self._finish(JobResult(job_metadata.job_id, False))
            return
        life = lives.pop()
        with self._regions_lock:
            region = self._regions[life]
        for k in keys:
            self._loading[k] += 1
            self._used[k] = self._step
        self._life_loads[life] += 1
        self._loads[job_metadata.job_id] = (life, keys)
        self._submit(self._loader, self._load, job_metadata.job_id, region,
                     [h[0] for h in held if h], list(job_metadata.chunk_ids))

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = [k for k in job_metadata.keys if len(k) == self._key_len]
        if len(keys) != len(job_metadata.keys):
            self._finish(JobResult(job_metadata.job_id, False))
            return
        if self._events is not None:
            self._store_keys[job_metadata.job_id] = keys
        self._submit(self._storer, self._store, job_metadata.job_id, keys,
                     list(job_metadata.chunk_ids))

    def _submit(self, pool: ThreadPoolExecutor, fn: Any, job_id: int, *args: Any) -> None:
        def run() -> None:
            t0 = time.monotonic()
            try:
                nbytes = fn(*args)
                res = JobResult(job_id, True, transfer_time=time.monotonic() - t0,
                                transfer_bytes=nbytes)
            except Exception as e:  # a failed copy or call fails the job, never the engine
                self._warn("copy", e)
                res = JobResult(job_id, False)
            self._finish(res)
        fut = pool.submit(run)
        self._futures.add(fut)
        fut.add_done_callback(self._futures.discard)

    def _load(self, region: kvpool.Region, rows: list[int], chunks: list[int]) -> int:
        for r, c in zip(rows, chunks):
            np.copyto(self._primary[c], np.frombuffer(region.row(r), dtype=np.uint8))
        return len(rows) * self.block_size_bytes

    def _store(self, keys: list[OffloadKey], chunks: list[int]) -> int:
        """On a store thread, on an idle writer's session (a reservation
        belongs to the session that made it): reserve, copy, commit, into
        the region of that writer's own pool life."""
        w = self._writers.get()
        try:
            return self._store_on(w, keys, chunks)
        finally:
            self._writers.put(w)

    def _store_on(self, w: kvpool.Client, keys: list[OffloadKey], chunks: list[int]) -> int:
        try:
            rows, _ = w.reserve(keys)
        except kvpool.Unauthenticated:  # kvpoold restarted or the lease ran out
            w.renew()
            rows, _ = w.reserve(keys)
        life = int(w.info["event_epoch"])
        with self._regions_lock:  # pinned: the scheduler thread closes unpinned lives
            self._store_pins[life] += 1
        try:
            region = self._life_region(w)
            mine = [(k, r, c) for k, r, c in zip(keys, rows, chunks) if r > 0]
            try:
                for _, r, c in mine:
                    np.copyto(np.frombuffer(region.row(r), dtype=np.uint8), self._primary[c])
            except BaseException:
                w.abort([k for k, _, _ in mine])
                raise
        finally:
            with self._regions_lock:
                self._store_pins[life] -= 1
                if self._store_pins[life] <= 0:
                    del self._store_pins[life]
        if mine:
            w.commit([k for k, _, _ in mine])
        return len(mine) * self.block_size_bytes

    def _finish(self, res: JobResult) -> None:
        with self._done_lock:
            self._done.append(res)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._done_lock:
            done, self._done = self._done, []
        for res in done:
            stored = self._store_keys.pop(res.job_id, None)
            if stored and res.success and self._events is not None:
                self._events.append(OffloadingEvent(keys=stored, medium=self.medium,
                                                    removed=False, locality=self.locality))
            life, keys = self._loads.pop(res.job_id, (None, ()))
            for k in keys:
                self._loading[k] -= 1
                if self._loading[k] <= 0:
                    del self._loading[k]
            if life is not None:
                self._life_loads[life] -= 1
                if self._life_loads[life] <= 0:
                    del self._life_loads[life]
        return done

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events:
            done, self._events = self._events, []
            yield from done

    def has_pending_work(self) -> bool:
        return bool(self._futures) or bool(self._done)

    def drain_jobs(self) -> None:
        for fut in list(self._futures):
            fut.result()

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def shutdown(self) -> None:
        self.drain_jobs()
        self._storer.shutdown(wait=True)
        self._loader.shutdown(wait=True)
        self._close_regions(keep=())
        if self._batch is not None:
            self._batch.close()
        for c in (*self._all_writers, self._client):
            c.close()

    def _warn(self, what: str, e: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_warning >= _ERROR_LOG_S:
            self._last_warning = now
            logger.warning("kvpool secondary tier: %s failed (%s); counted as misses and "
                           "skipped stores", what, e)
