# SPDX-License-Identifier: Apache-2.0
"""kvpool as vLLM's offloading tier: an out-of-tree OffloadingSpec that
vLLM's OffloadingConnector loads from configuration alone.

    vllm serve MODEL --kv-transfer-config '{
      "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {
        "spec_name": "KVPoolOffloadingSpec",
        "spec_module_path": "kvpool.vllm_offload",
        "kvpool_url": "ipc:///run/kvpool/kvpool.ipc",
        "kvpool_pool": "tier", "kvpool_token_file": "/etc/kvpool/token"}}'

Every engine (and data-parallel replica) on a host that names the same pool
shares one tier: kvpoold's shared region (a cpu pool's memory, mapped by each
worker) holds the KV, kvpoold's pool decides what is cached, evicted and
leased, and kvpoold publishes the tier's BlockStored/BlockRemoved (medium
CPU) on its event streams.

Scheduler side (KVPoolOffloadingManager), per engine step, in one round
trip at the step's end (on_schedule_end: a batch), none on a step with
nothing to ask:
  - lookup(key) answers from what the last round trip locked; a key not yet
    asked about answers RETRY (vLLM's "ask again next step") and is looked up,
    and its hit locked, at the step's end. A HIT is therefore always a row
    this engine holds a lock on, so prepare_load can never find it gone;
  - prepare_store(keys) answers at once with every key not known to be
    stored; the rows are reserved at the step's end (Reserve), before vLLM
    sends the step's jobs to the workers, and a key someone else stored
    meanwhile gets no row (the worker skips it);
  - complete_store commits (or aborts) the reserved keys, complete_load
    unlocks; locks no load used by the end of the next step are released.
A store that fails, or an engine that dies before committing, leaves nothing
visible (uncommitted reservations go with the session). take_events yields
nothing: the tier's events are kvpoold's, one stream for every engine.

Worker side (KVPoolOffloadingWorker): each worker maps the region and copies
its own shard of each row (the pool's shards = vLLM's world size) to and
from vLLM's KV cache tensors: one page per layer tensor of the block's
group, back to back.

Differences from vLLM's CPU spec: one offloaded block per GPU block
(blocks_per_chunk 1, the OffloadingConnector's default); the direct layout
only (not canonical_layout or replicated_layout); reset_cache does not clear
the shared tier (other engines use it); a new request's first lookups take
one extra step (RETRY) while they are answered.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Iterable, Optional

from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (CanonicalKVCaches, LoadStoreSpec, LookupResult,
                                     OffloadingManager, OffloadingSpec, OffloadingWorker,
                                     OffloadKey, PrepareStoreOutput, ReqContext,
                                     RequestOffloadingContext)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import kvpool
from kvpool._offload_tier import (KVPoolRowsSpec, _check_tier, _connect,  # noqa: F401
                                  _engine_pod, check_hashing)
from kvpool.vllm_offload_worker import KVPoolOffloadingWorker

logger = init_logger(__name__)
_BACKOFF_S, _BACKOFF_MAX_S = 0.5, 5.0  # between tries at a tier that does not answer
_LEASE_S = 30.0  # kvpoold's default session lease
_FILLING = -2  # a lookup's row while the pool's cluster tier fills the key (docs/cluster.md)

__all__ = ["KVPoolOffloadingSpec", "KVPoolOffloadingManager", "KVPoolOffloadingWorker",
           "KVPoolRowsSpec"]


class _TierDown(Exception):
    """kvpoold did not answer in time, or answered what the tier cannot use:
    the scheduler goes on without the tier."""


# Statuses a call site of the scheduler's tier handles itself: any other
# error of a call becomes _TierDown (misses, skipped stores), never an
# exception out of vLLM's scheduler, which would end the engine.
_HANDLED = (kvpool.NotFound, kvpool.NotOwner, kvpool.NoSpace, kvpool.QuotaExceeded)
_ERROR_LOG_S = 60.0  # one warning a minute for answers the tier cannot use
_HIT, _MISS, _RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY


class KVPoolOffloadingManager(OffloadingManager):
    """vLLM's OffloadingManager over one kvpoold pool (see the module's doc).

    State, per key: one pool lock at most (`rows`: the locked keys and their
    rows), shared by every load of this engine that uses the key (`loading`
    counts them) and kept while lookups or loads keep using it, released two
    steps after the last; misses (valid for the one step after the round
    trip that found them: a miss goes stale as soon as anyone may have
    stored the key); keys found stored by someone else when reserving; and
    stores between prepare_store and complete_store (`storing`)."""

    def __init__(self, extra: dict[str, Any], config: OffloadingConfig, blocks_per_chunk: int):
        self._extra = dict(extra)
        self._name = f"vllm-scheduler {config.engine_id}"
        self._pod = _engine_pod(self._extra)
        # Each pool life's region this engine answered from, held open until no
        # load of it is left: a worker that has not mapped it yet maps it
        # through this descriptor, even after that kvpoold died and its file
        # was removed (a HIT granted is always a load that can complete).
        self._regions: dict[int, kvpool.Region] = {}
        self._life: Optional[int] = None  # the session's pool life (its info's event_epoch)
        self._refs: dict[int, kvpool.RegionRef] = {}  # each held region's ref, for the specs
        self._client: Optional[kvpool.Client] = self._open()
        _check_tier(self._client, config, blocks_per_chunk)
        self._key_len = self._client.key_len
        self._rows: dict[OffloadKey, int] = {}        # keys this session holds locked
        self._used: dict[OffloadKey, int] = {}        # locked key -> the last step it was used
        # Loads in flight: per key, of this session's life (_loading_epoch), and
        # of earlier lives (a renewal moves them there), which complete first.
        self._loading: dict[OffloadKey, int] = {}
        self._loading_epoch: Optional[int] = None
        self._old_loads: dict[int, Counter[OffloadKey]] = {}
        self._missed: dict[OffloadKey, int] = {}      # key -> the step its miss is valid in
        self._stored_elsewhere: dict[OffloadKey, int] = {}  # key -> the step it was seen
        self._pending_lookup: dict[OffloadKey, None] = {}
        self._batch: Optional[kvpool.Batch] = None  # the step's calls, reused step after step
        self._batch_client: Optional[kvpool.Client] = None
        self._pending_store: list[KVPoolRowsSpec] = []
        self._storing: set[OffloadKey] = set()
        self._reserved: set[OffloadKey] = set()
        self._to_commit: list[OffloadKey] = []
        self._to_abort: list[OffloadKey] = []
        self._step = 0
        self.round_trips = 0
        self._shut = False
        self._down_since: Optional[float] = None  # when kvpoold stopped answering
        self._down_until = 0.0                     # no call before then
        self._backoff = _BACKOFF_S
        self._suspect = False  # a call failed: the session is renewed before the next one
        self._suspect_since = 0.0
        self._bad_key_logged = False
        self.errors = 0  # calls that failed with an error other than an outage
        self._error_logged = -_ERROR_LOG_S

    # ---- the pool: a new session when the old one is gone; an outage is a miss ----
    def _open(self) -> kvpool.Client:
        """A session, with its pool life's region held open (see _regions)."""
        # A scheduler step waits on the tier for at most a second: past that it is down.
        c = _connect(self._extra, self._name, self._pod, timeout_ms=1000, retries=0)
        try:
            self._hold_region(c)
        except BaseException:
            c.close()
            raise
        return c

    def _hold_region(self, c: kvpool.Client) -> None:
        epoch = self._life = int(c.info["event_epoch"])
        if epoch not in self._regions:
            r = self._regions[epoch] = c.region()
            self._refs[epoch] = r.ref()

    def _region_ref(self) -> Optional[kvpool.RegionRef]:
        """The current life's region, for the workers (None without a session)."""
        epoch = self._epoch()
        return self._refs.get(epoch) if epoch is not None else None

    def _release_regions(self) -> None:
        """Closes the regions no load uses any more but the current life's,
        and that too while a call failed (a dead kvpoold's region is memory
        no one else frees; the next session holds its own again)."""
        if len(self._regions) < 2 and not self._suspect:
            return  # the one held is this life's, in use
        now = None if self._suspect else self._epoch()
        for e in [e for e in self._regions if e != now and e not in self._old_loads and
                  not (e == self._loading_epoch and self._loading)]:
            self._refs.pop(e, None)
            self._regions.pop(e).close()

    def _age_loads(self) -> None:
        """The loads in flight become an earlier life's (a renewal, or a
        session of another life): they hold no lock of the session now."""
        if self._loading and self._loading_epoch is not None:
            self._old_loads.setdefault(self._loading_epoch, Counter()).update(self._loading)
        self._loading = {}

    def _call(self, fn, *args):
        """fn(client, *args); _TierDown while kvpoold does not answer (the
        callers then miss, skip the store or drop the release), retried after
        a backoff of 0.5 s doubling to 5 s, so an outage costs the scheduler
        one timeout per backoff, not one per call. The first call after an
        outage opens a new session, once no copy uses the old one's rows."""
        if self._shut:
            raise RuntimeError("kvpool: the offloading manager was shut down")
        if time.monotonic() < self._down_until:
            raise _TierDown()
        if self._suspect and (self._loading or self._old_loads or self._reserved):
            # Copies in flight use this session's locks and reservations: renew after them.
            self._down_until = time.monotonic() + _BACKOFF_S
            raise _TierDown()
        try:
            if self._client is None or self._suspect:
                # A call that timed out may still have run, leaving locks or reservations
                # no one will release: a new session drops them with the old one.
                self._renew()
            try:
                self.round_trips += 1
                out = fn(self._client, *args)
            except kvpool.Unauthenticated:
                # The session is gone (its lease ran out while the engine was idle, or
                # kvpoold restarted): its reservations and locks went with it.
                self._renew()
                self.round_trips += 1
                out = fn(self._client, *args)
        except (kvpool.Busy, kvpool.Unavailable) as e:
            self._outage(e)
            raise _TierDown() from e
        except _HANDLED:
            raise
        except Exception as e:  # noqa: BLE001: any other answer is a miss, never a crash
            self._failed(fn, e)
            raise _TierDown() from e
        if self._down_since is not None:
            logger.info("kvpool: the tier at %s answers again after %.1f s",
                        self._extra.get("kvpool_url"), time.monotonic() - self._down_since)
            self._down_since, self._backoff = None, _BACKOFF_S
        return out

    def _renew(self) -> None:
        """A new session in place of the old one, whose locks and
        reservations the daemon drops in the same round trip (Hello naming
        it); a restarted kvpoold never knew it. Raises as a call does while
        kvpoold does not answer, the old session kept for the next try."""
        self._age_loads()
        for state in (self._rows, self._used, self._missed, self._stored_elsewhere):
            state.clear()
        self._reserved.clear()
        if self._client is None:
            self._client = self._open()
        else:
            self._client.renew()
            self._hold_region(self._client)
        self._suspect = False

    def _failed(self, fn, e: Exception) -> None:
        """A call the daemon answered with an error the tier cannot use
        (INTERNAL, garbage, OK without a result): counted in `errors`,
        warned about once a minute, and the session renewed before the next
        call, after the same backoff as an outage."""
        self.errors += 1
        now = time.monotonic()
        if now - self._error_logged >= _ERROR_LOG_S:
            self._error_logged = now
            logger.warning("kvpool: %s on the tier at %s failed (%s: %s; %d such failure(s) so "
                           "far): lookups miss and stores are skipped meanwhile",
                           fn if isinstance(fn, str) else getattr(fn, "__name__", fn),
                           self._extra.get("kvpool_url"),
                           type(e).__name__, e, self.errors)
        if not self._suspect:
            self._suspect, self._suspect_since = True, now
        self._down_until = now + self._backoff
        self._backoff = min(2 * self._backoff, _BACKOFF_MAX_S)

    def _outage(self, e: Exception) -> None:
        now = time.monotonic()
        if not self._suspect:
            self._suspect, self._suspect_since = True, now
        if self._down_since is None:
            self._down_since = now
            logger.warning("kvpool: the tier at %s does not answer (%s): lookups miss and "
                           "stores are skipped until it does", self._extra.get("kvpool_url"), e)
        self._down_until = now + self._backoff
        self._backoff = min(2 * self._backoff, _BACKOFF_MAX_S)

    def _epoch(self) -> Optional[int]:
        """The pool's life this session belongs to: the rows it hands out are that region's."""
        return None if self._client is None else self._life

    def _bad_key(self, key: OffloadKey) -> bool:
        """For a key not of the pool's length (an engine hashing with another
        algorithm, where the start could not see vLLM's setting): False, so
        it misses and is never stored, logged once, never raised, since an
        exception here would end the engine."""
        if not self._bad_key_logged:
            self._bad_key_logged = True
            logger.error("kvpool: an offload key of %d bytes; pool %s's are %d: its hash_algo "
                         "must be vLLM's --prefix-caching-hash-algo. The tier misses until "
                         "they match", len(key), self._extra.get("kvpool_pool", "default"),
                         self._key_len)
        return False

    # ---- OffloadingManager ----
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._suspect:
            if time.monotonic() < self._down_until:
                return _MISS  # no new load on the old session's rows (see _call)
        elif key in self._rows:
            self._used[key] = self._step  # still wanted: its lock stays
            return _HIT
        if self._missed.get(key) == self._step:
            return _MISS
        if key in self._storing:
            return LookupResult.HIT_PENDING  # this engine is writing it
        if len(key) != self._key_len and not self._bad_key(key):
            return _MISS
        self._pending_lookup[key] = None
        return _RETRY

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource.HOST

    def prepare_load(self, keys, req_context: ReqContext) -> LoadStoreSpec:
        keys = list(keys)
        missing = list(dict.fromkeys(k for k in keys if k not in self._rows))
        if missing:
            # Not answered HIT by lookup() this step (vLLM never does this): lock them now.
            try:
                rows, _ = self._call(kvpool.Client.lookup_and_lock, missing)
            except (kvpool.QuotaExceeded, _TierDown):
                raise RuntimeError("kvpool: prepare_load while the tier does not answer") \
                    from None
            if any(r <= 0 for r in rows):
                got = [k for k, r in zip(missing, rows) if r > 0]
                if got:
                    self._call(kvpool.Client.unlock, got)
                raise RuntimeError("kvpool: prepare_load of a key the tier does not hold")
            self._rows.update(zip(missing, rows))
        epoch = self._epoch()
        if epoch != self._loading_epoch:
            self._age_loads()
            self._loading_epoch = epoch
        loading, step = self._loading, self._step
        for k in keys:
            loading[k] = loading.get(k, 0) + 1
        self._used.update(dict.fromkeys(keys, step))
        # _rows holds only the current session's rows: a renewed session clears it
        rows = self._rows
        return KVPoolRowsSpec(keys, [rows[k] for k in keys], epoch, self._region_ref())

    def touch(self, keys, req_context: ReqContext) -> None:
        return  # the pool's LRU is kvpoold's: a lock and its release are the touch

    def complete_load(self, keys, req_context: ReqContext) -> None:
        loading, used, step = self._loading, self._used, self._step
        for k in keys:
            if self._old_loads and self._complete_old(k):
                continue  # an earlier life's load: the oldest completes first
            n = loading.get(k, 0)
            if n > 0:
                if n == 1:
                    del loading[k]
                else:
                    loading[k] = n - 1
                used[k] = step
        self._release_regions()

    def _complete_old(self, k: OffloadKey) -> bool:
        for e in sorted(self._old_loads):
            c = self._old_loads[e]
            if c[k] > 0:
                c[k] -= 1
                if c[k] == 0:
                    del c[k]
                    if not c:
                        del self._old_loads[e]
                return True
        return False

    def prepare_store(self, keys, req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        todo = []
        storing, rows, elsewhere = self._storing, self._rows, self._stored_elsewhere
        since, kl = self._step - 1, self._key_len
        for k in keys:
            if k in storing or k in rows or elsewhere.get(k, -9) >= since:
                continue  # stored, or being stored: one writer per key
            if len(k) != kl and not self._bad_key(k):
                continue
            storing.add(k)
            todo.append(k)
        spec = KVPoolRowsSpec(todo)
        if todo:
            self._pending_store.append(spec)
        return PrepareStoreOutput(keys_to_store=todo, store_spec=spec, evicted_keys=[])

    def complete_store(self, keys, req_context: ReqContext, success: bool = True) -> None:
        for k in keys:
            self._storing.discard(k)
            if k in self._reserved:
                self._reserved.discard(k)
                (self._to_commit if success else self._to_abort).append(k)

    def take_events(self) -> Iterable[Any]:
        return ()  # kvpoold publishes the tier's events, once for every engine

    def has_pending_work(self) -> bool:
        """Also while the session is suspect (a call timed out, and may have
        run on a stalled kvpoold, locking rows for no one): the engine keeps
        stepping, idle or not, until a call renews the session and the daemon
        drops those locks with the old one, for at most a lease (30 s, when
        the daemon drops them itself)."""
        return bool(self._pending_lookup or self._pending_store or self._to_commit or
                    self._to_abort or self._rows or
                    (self._suspect and time.monotonic() - self._suspect_since < _LEASE_S))

    def on_schedule_end(self, context: Any = None) -> None:
        """The step's calls, in one round trip (a batch, each call with its
        own status), none on a step with nothing to ask: commits, aborts and
        unlocks; the step's reservations (filling the rows of the specs vLLM
        is about to send to the workers); the step's lookups, each hit locked."""
        self._step += 1
        self._expire()
        commits, self._to_commit = self._to_commit, []
        aborts, self._to_abort = self._to_abort, []
        # A lock no load holds and no lookup or load used in two steps goes.
        loading, old = self._loading, self._step - 2
        idle = [k for k, st in self._used.items() if st < old and k not in loading]
        for k in idle:
            del self._used[k]
            del self._rows[k]
        specs, self._pending_store = self._pending_store, []
        stores = [k for sp in specs for k in sp.keys]  # distinct: prepare_store saw to that
        lookups = [k for k in self._pending_lookup if k not in self._rows]  # one lock per key
        self._pending_lookup = {}
        res: dict[str, tuple[Any, list[int]]] = {}
        if commits or aborts or idle or stores or lookups:
            try:
                res = self._call(self._step_batch, commits, aborts, idle, stores, lookups)
            except _TierDown:
                pass  # no tier: releases go with the session, stores skipped, lookups miss
        self._stored(specs, stores, res.get("reserve"))
        self._looked_up(lookups, res.get("lookup_and_lock"))
        self._release_regions()

    def _step_batch(self, client: kvpool.Client, commits, aborts, idle, stores, lookups):
        """The step's calls in one Batch on client: {kind: (its error or None,
        its rows)} (Batch.send_rows).
        An error a call site cannot use is counted as _failed's are; the
        expected ones (a renewed session's keys, no room, the quota) are
        the call sites'."""
        if self._batch is None or self._batch_client is not client:
            if self._batch is not None:
                self._batch.close()
            self._batch, self._batch_client = client.batch(keep_going=True), client
        b = self._batch
        b.clear()
        kinds = []
        adders: list[tuple[str, list, Any]] = [
            ("commit", commits, b.commit), ("abort", aborts, b.abort), ("unlock", idle, b.unlock),
            ("reserve", stores, b.reserve), ("lookup_and_lock", lookups, b.lookup_and_lock)]
        for kind, keys, add in adders:
            if keys:
                add(keys)
                kinds.append(kind)
        results = dict(zip(kinds, b.send_rows()))
        for kind, (err, _) in results.items():
            if err is not None and not isinstance(err, _HANDLED):
                self._failed(kind, err)
        return results

    def _stored(self, specs, keys, r) -> None:
        """The step's reservations: each spec's rows, or -1 (stored by someone
        already, no room, this engine at its quota, or no tier)."""
        if not specs:
            return
        rows = r[1] if r is not None and r[0] is None else [-1] * len(keys)
        row_of = dict(zip(keys, rows))
        for k, row in row_of.items():
            if row > 0:
                self._reserved.add(k)
            else:
                self._storing.discard(k)
                self._stored_elsewhere[k] = self._step
        epoch = self._epoch()  # the session that answered: a renewed one's, if _call renewed it
        ref = self._region_ref()
        for sp in specs:
            sp.rows[:] = [row_of[k] for k in sp.keys]
            sp.epoch, sp.region = epoch, ref

    def _looked_up(self, keys, r) -> None:
        """The step's lookups: each hit locked, each miss valid for a step; a
        key the cluster tier is filling (-2) stays RETRY and is asked again."""
        rows = r[1] if r is not None and r[0] is None else [-1] * len(keys)
        for k, row in zip(keys, rows):
            if row > 0:
                self._rows[k] = row
                self._used[k] = self._step
            elif row != _FILLING:
                self._missed[k] = self._step

    def _expire(self) -> None:
        """Misses go stale; so do keys seen stored elsewhere, after a step."""
        self._missed.clear()
        for k in [k for k, st in self._stored_elsewhere.items() if st < self._step - 1]:
            del self._stored_elsewhere[k]

    def reset_cache(self) -> None:
        self._missed.clear()  # the shared tier is not this engine's to clear

    def shutdown(self) -> None:
        self._shut = True
        if self._batch is not None:
            self._batch.close()
            self._batch = self._batch_client = None
        if self._client is not None:
            try:
                self._client.close()  # Goodbye: every reservation and lock goes
            except kvpool.KvpoolError:
                pass  # kvpoold is gone, and the session with it
            self._client = None
        for r in self._regions.values():
            r.close()
        self._regions.clear()


class KVPoolOffloadingSpec(OffloadingSpec):
    """The spec vLLM's OffloadingConnector loads (spec_name KVPoolOffloadingSpec,
    spec_module_path kvpool.vllm_offload). kv_connector_extra_config keys:
    kvpool_url (required), kvpool_pool (default "default"), kvpool_token or
    kvpool_token_file, kvpool_timeout_ms (how long a call may wait: the
    scheduler's 1000, past which the tier counts as down; the workers' 5000),
    kvpool_vllm_pod (default $POD_IP)."""

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        self._manager: Optional[KVPoolOffloadingManager] = None
        self._worker: Optional[KVPoolOffloadingWorker] = None
        if not self.extra_config.get("kvpool_url"):
            raise ValueError("kvpool: kv_connector_extra_config needs kvpool_url")

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = KVPoolOffloadingManager(self.extra_config, self.config,
                                                    self.blocks_per_chunk)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = KVPoolOffloadingWorker(self.extra_config, self.config, kv_caches)
        return self._worker
