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

import os
import threading
import time
from collections import Counter, deque
from typing import Any, Iterable, Optional

import numpy as np

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    TransferResult,
)
from vllm.logger import init_logger
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import kvpool
from kvpool.kv_copy import PageCopier, RegionMap

logger = init_logger(__name__)
_BACKOFF_S, _BACKOFF_MAX_S = 0.5, 5.0  # between tries at a tier that does not answer
_LEASE_S = 30.0  # kvpoold's default session lease

__all__ = ["KVPoolOffloadingSpec", "KVPoolOffloadingManager", "KVPoolOffloadingWorker",
           "KVPoolRowsSpec"]


class KVPoolRowsSpec(LoadStoreSpec):
    """Rows of kvpoold's shared region, one per offloaded block, in the order
    of the job's GPU blocks; -1 (stores only): the key needs no write (it
    was stored by someone else meanwhile, or the pool had no room). epoch
    names the pool's life the rows belong to (Hello's event_epoch, new at
    each kvpoold start, whose region is a new file); None: the worker's
    current one. region: that life's region as the scheduler holds it open
    (kvpool.RegionRef), so a worker that has not mapped it yet maps it
    through the scheduler's descriptor, even with kvpoold gone."""

    def __init__(self, keys: list[OffloadKey], rows: Optional[list[int]] = None,
                 epoch: Optional[int] = None, region: Optional[kvpool.RegionRef] = None):
        self.keys = list(keys)
        self.rows = np.full(len(self.keys), -1, dtype=np.int32) if rows is None else \
            np.asarray(rows, dtype=np.int32)
        self.epoch = epoch
        self.region = region

    def __repr__(self) -> str:
        return f"KVPoolRowsSpec({self.rows.tolist()}, epoch={self.epoch})"


class _TierDown(Exception):
    """kvpoold did not answer in time, or answered what the tier cannot use:
    the scheduler goes on without the tier."""


# Statuses a call site of the scheduler's tier handles itself: any other
# error of a call becomes _TierDown (misses, skipped stores), never an
# exception out of vLLM's scheduler, which would end the engine.
_HANDLED = (kvpool.NotFound, kvpool.NotOwner, kvpool.NoSpace, kvpool.QuotaExceeded)
_ERROR_LOG_S = 60.0  # one warning a minute for answers the tier cannot use


def _connect(extra: dict[str, Any], name: str, vllm_pod: Optional[str] = None,
             timeout_ms: int = 5000, retries: int = 2) -> kvpool.Client:
    url = extra.get("kvpool_url")
    if not url:
        raise ValueError("kvpool: kv_connector_extra_config needs kvpool_url "
                         "(kvpoold's ipc:// URL on this host)")
    token = extra.get("kvpool_token")
    tf = extra.get("kvpool_token_file")
    if token is None and tf:
        with open(tf, encoding="utf-8") as f:
            token = f.read().strip()
    return kvpool.Client(url, pool=extra.get("kvpool_pool", "default"), token=token,
                         client_name=name,
                         timeout_ms=int(extra.get("kvpool_timeout_ms", timeout_ms)),
                         retries=retries,
                         vllm_pod=vllm_pod)


def _engine_pod(extra: dict[str, Any]) -> Optional[str]:
    """The pod the tier's events are credited to: kvpool_vllm_pod, else $POD_IP
    (llm-d's {pod}, from the downward API), else none."""
    return extra.get("kvpool_vllm_pod") or os.environ.get("POD_IP") or None


def _engine_hash_algo() -> Optional[str]:
    """vLLM's --prefix-caching-hash-algo for the engine being built, where
    vLLM has its config current (None where not)."""
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:
        return None
    cfg = get_current_vllm_config_or_none()
    return getattr(getattr(cfg, "cache_config", None), "prefix_caching_hash_algo", None)


def check_hashing(info: dict, algo: Optional[str],
                  hash_seed: Optional[str] = None) -> Optional[str]:
    """Refuses (ValueError naming both settings) an engine whose block
    hashes can never be the pool's keys: another algorithm, so another key
    length, on which every lookup would fail. Returns a warning, or None,
    when they match but engines cannot share: vLLM's xxhash algorithms draw
    a random NONE_HASH in each engine unless PYTHONHASHSEED (hash_seed) is
    set, so no engine hits another's blocks."""
    pool = info["hash_algorithm"]
    if algo is not None and algo != pool:
        raise ValueError(
            f"kvpool: vLLM hashes blocks with --prefix-caching-hash-algo {algo}, pool "
            f"{info['pool']} with hash_algo={pool}: no key could ever match. Start vLLM with "
            f"--prefix-caching-hash-algo {pool}, or the pool with hash_algo={algo}")
    if (algo or pool).startswith("xxhash") and not hash_seed:
        return (f"kvpool: vLLM's {algo or pool} draws a random NONE_HASH in each engine "
                "unless PYTHONHASHSEED is set: engines on this tier will not hit each other's "
                "blocks. Set PYTHONHASHSEED to one value in every engine that shares it")
    return None


def _check_tier(c: kvpool.Client, config: OffloadingConfig, blocks_per_chunk: int,
                need: Optional[int] = None) -> None:
    """The pool must be a region whose shard can hold one worker's block
    (need bytes: the worker's own count, else the config's, 0 if unknown),
    keyed by the engine's hash algorithm."""
    info = c.info
    warning = check_hashing(info, _engine_hash_algo(), os.environ.get("PYTHONHASHSEED"))
    if warning:
        logger.warning("%s", warning)
    if not info.get("region"):
        raise ValueError(f"kvpool: pool {info['pool']} has no shared region (a cpu pool "
                         "with prefix caching, and kvpoold's --region-dir)")
    if blocks_per_chunk != 1:
        raise ValueError("kvpool: one offloaded block per GPU block only (leave the "
                         "OffloadingConnector's block_size at the GPU block size)")
    if config.canonical_layout or config.replicated_layout:
        raise ValueError("kvpool: the direct layout only (no canonical_layout or "
                         "replicated_layout)")
    ex = info["executor"] or {}
    world = max(1, config.parallel.world_size)
    if need is None:
        need = config.worker_kv_bytes_per_block
    with c.region() as reg:
        shards, shard_bytes = reg.shards, reg.shard_bytes
    if shards != world or (need and shard_bytes < need):
        raise ValueError(
            f"kvpool: pool {info['pool']} has {shards} shard(s) of {shard_bytes} bytes a row; "
            f"this engine has {world} worker(s) of {need} KV bytes a block: give the pool "
            f"shards={world} and a KV shape of at least {need * world} bytes a block "
            f"(layers x 2 x block_size x KV heads x head_size x dtype size; now "
            f"{ex.get('block_bytes')})")


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
        self._client: Optional[kvpool.Client] = self._open()
        _check_tier(self._client, config, blocks_per_chunk)
        self._key_len = self._client.key_len
        self._rows: dict[OffloadKey, int] = {}        # keys this session holds locked
        self._used: dict[OffloadKey, int] = {}        # locked key -> the last step it was used
        self._loading: Counter[OffloadKey] = Counter()  # loads in flight per locked key
        self._missed: dict[OffloadKey, int] = {}      # key -> the step its miss is valid in
        self._stored_elsewhere: dict[OffloadKey, int] = {}  # key -> the step it was seen
        self._load_epochs: dict[OffloadKey, deque[int]] = {}  # per key, its loads' lives
        self._epoch_loads: Counter[int] = Counter()            # loads in flight per life
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
        epoch = int(c.info["event_epoch"])
        if epoch not in self._regions:
            self._regions[epoch] = c.region()

    def _region_ref(self) -> Optional[kvpool.RegionRef]:
        """The current life's region, for the workers (None without a session)."""
        epoch = self._epoch()
        r = self._regions.get(epoch) if epoch is not None else None
        return r.ref() if r is not None else None

    def _release_regions(self) -> None:
        """Closes the regions no load uses any more but the current life's,
        and that too while a call failed (a dead kvpoold's region is memory
        no one else frees; the next session holds its own again)."""
        now = None if self._suspect else self._epoch()
        for e in [e for e in self._regions if e != now and self._epoch_loads[e] <= 0]:
            self._epoch_loads.pop(e, None)
            self._regions.pop(e).close()

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
        if self._suspect and (any(self._loading.values()) or self._reserved):
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
        for state in (self._rows, self._used, self._loading, self._missed,
                      self._stored_elsewhere):
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
        return None if self._client is None else int(self._client.info["event_epoch"])

    def _key_fits(self, key: OffloadKey) -> bool:
        """Whether the key is one the pool can hold. One that is not (an
        engine hashing with another algorithm, where the start could not
        see vLLM's setting) misses and is never stored: logged once, never
        raised, since an exception here would end the engine."""
        if len(key) == self._key_len:
            return True
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
        if self._suspect and time.monotonic() < self._down_until:
            return LookupResult.MISS  # no new load on the old session's rows (see _call)
        if key in self._rows and not self._suspect:
            self._used[key] = self._step  # still wanted: its lock stays
            return LookupResult.HIT
        if self._missed.get(key) == self._step:
            return LookupResult.MISS
        if key in self._storing:
            return LookupResult.HIT_PENDING  # this engine is writing it
        if not self._key_fits(key):
            return LookupResult.MISS
        self._pending_lookup[key] = None
        return LookupResult.RETRY

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
        for k in keys:
            self._loading[k] += 1
            self._used[k] = self._step
            if epoch is not None:
                self._load_epochs.setdefault(k, deque()).append(epoch)
                self._epoch_loads[epoch] += 1
        # _rows holds only the current session's rows: a renewed session clears it
        return KVPoolRowsSpec(keys, [self._rows[k] for k in keys], epoch, self._region_ref())

    def touch(self, keys, req_context: ReqContext) -> None:
        return  # the pool's LRU is kvpoold's: a lock and its release are the touch

    def complete_load(self, keys, req_context: ReqContext) -> None:
        for k in keys:
            lives = self._load_epochs.get(k)
            if lives:
                self._epoch_loads[lives.popleft()] -= 1
                if not lives:
                    del self._load_epochs[k]
            if self._loading[k] > 0:
                self._loading[k] -= 1
                if self._loading[k] == 0:
                    del self._loading[k]
                self._used[k] = self._step
        self._release_regions()

    def prepare_store(self, keys, req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        todo = []
        for k in keys:
            if (k in self._storing or k in self._rows or
                    self._stored_elsewhere.get(k, -9) >= self._step - 1):
                continue  # stored, or being stored: one writer per key
            if not self._key_fits(k):
                continue
            self._storing.add(k)
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
        idle = [k for k, st in self._used.items()
                if st < self._step - 2 and not self._loading[k]]
        for k in idle:
            del self._used[k]
            del self._rows[k]
        specs, self._pending_store = self._pending_store, []
        stores = [k for sp in specs for k in sp.keys]  # distinct: prepare_store saw to that
        lookups = [k for k in self._pending_lookup if k not in self._rows]  # one lock per key
        self._pending_lookup = {}
        res: dict[str, Any] = {}
        if commits or aborts or idle or stores or lookups:
            try:
                res = self._call(self._step_batch, commits, aborts, idle, stores, lookups)
            except _TierDown:
                pass  # no tier: releases go with the session, stores skipped, lookups miss
        self._stored(specs, stores, res.get("reserve"))
        self._looked_up(lookups, res.get("lookup_and_lock"))
        self._release_regions()

    def _step_batch(self, client: kvpool.Client, commits, aborts, idle, stores, lookups):
        """The step's calls in one Batch on client: {kind: its CallResult}.
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
        results = dict(zip(kinds, b.send()))
        for kind, r in results.items():
            if r.error is not None and not isinstance(r.error, _HANDLED):
                self._failed(kind, r.error)
        return results

    def _stored(self, specs, keys, r) -> None:
        """The step's reservations: each spec's rows, or -1 (stored by someone
        already, no room, this engine at its quota, or no tier)."""
        if not specs:
            return
        rows = r.block_ids if r is not None and r.ok else [-1] * len(keys)
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
        """The step's lookups: each hit locked, each miss valid for a step."""
        rows = r.block_ids if r is not None and r.ok else [-1] * len(keys)
        for k, row in zip(keys, rows):
            if row > 0:
                self._rows[k] = row
                self._used[k] = self._step
            else:
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
