# SPDX-License-Identifier: Apache-2.0
"""kvpool's cluster tier: one node's agent between its kvpoold region and a
Mooncake Store that every node of the fleet shares (docs/cluster.md).

    python -m kvpool.cluster --url ipc:///run/kvpool/kvpool.ipc --pool tier \\
        --events ipc:///run/kvpool/events.ipc \\
        --master 10.0.0.1:50051 --metadata http://10.0.0.1:8080/metadata \\
        --host 10.0.0.2 --model llama-3-8b --layout fp16,h8,d128,l32,b16,tp0of1

Two loops, each with its own kvpoold session:
  - write-behind: follows the pool's event stream; each committed row
    (BlockStored) is locked, put into the store straight from the region
    (Mooncake reads the mapping in place: no copy through Python), and
    unlocked. Policy "all" puts every one; "hits:N" only a row engines'
    lookups hit N times since its commit (looked at once a second for up
    to hits_window_s; the agent's own looks count nothing); "pinned" only
    the pinned prefixes' rows (cluster_pins.py), which every policy but
    "none" puts at once, soft-pinned;
  - fill: the pool (cluster_wait_ms set) answers a missed key "pending" and
    queues it; the agent takes queued keys (ClusterFill), asks the store which
    it holds, reserves rows for those, has the store write each object
    straight into its row, checks the trailer and the row's CRC32C, and
    commits (a hit for every engine of the node) or aborts; keys the store
    lacks are reported absent, so lookups miss them at once.
Engines change nothing but the pool's setting: their lookups see RETRY
while a fill runs, then hits. A store that is down, slow or partitioned
only turns fills into misses (cluster_store.py's deadlines); a kvpoold that
restarts is followed to its new region.
"""
from __future__ import annotations

import argparse
import json
import logging
import mmap
import os
import signal
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Optional, cast

import kvpool
from kvpool.events import BlockStored, Reset
from kvpool.cluster_log import FleetEvents, Recent
from kvpool.cluster_pins import PinSet, load_pins
from kvpool.cluster_store import (NOT_FOUND, TRAILER, Namespace, StoreConfig, StoreDown,
                                  StoreWorker, check_trailer, pack_trailer, private_address)

log = logging.getLogger("kvpool.cluster")
DISK_MEDIUM = "STORAGE"  # a disk tier's events (docs/operations.md, "Disk tier")
CLUSTER_MEDIUM = "CLUSTER"  # the cluster's blocks, as the pool announces them

__all__ = ["ClusterTier", "TierConfig", "main"]


@dataclass
class TierConfig:
    url: str                      # kvpoold's rpc url (same host)
    events: str                   # kvpoold's event stream url
    store: StoreConfig
    tenant: str = "default"
    model: str = ""
    layout: str = ""
    pool: str = "default"
    token: Optional[str] = None
    write_behind: bool = True     # put committed rows (False: fill only)
    min_hits: int = 0             # 0: every committed row ("all"); N: rows hit N times ("hits:N")
    pinned_only: bool = False     # "pinned": only the pinned prefixes' rows
    pin_file: Optional[str] = None  # pinned prefixes (cluster_pins.py): put whatever the policy
    pin_seed: Optional[str] = None  # the engines' PYTHONHASHSEED (None: vLLM's default)
    pin_groups: tuple[int, ...] = (0,)
    pin_sweep_s: float = 10.0     # between looks for pinned rows the store lacks
    hits_window_s: float = 600.0  # how long a committed row may wait for its hits
    hits_look_s: float = 1.0      # between looks at a waiting row's count
    batch: int = 64               # keys per store call
    poll_s: float = 0.0005        # between ClusterFill calls within hot_s of a wanted key
    idle_poll_s: float = 0.005    # between them after that
    hot_s: float = 1.0            # how long a wanted key keeps the fill loop polling fast
    queue: int = 65536            # committed keys waiting to be put, at most
    log_poll_s: float = 0.5       # between reads of the fleet's announcement log
    audit_s: float = 10.0         # between looks at whether the store still holds our puts
    allow_public: bool = False


class _Node:
    """One kvpoold life: a session for each loop, the region, the trailers,
    and a store worker for each loop (fill: gets, lending no memory; put:
    puts, lending the node's segment; log: the announcement log's small
    objects) mapping both through descriptors."""

    def __init__(self, cfg: TierConfig) -> None:
        self.fill = kvpool.Client(cfg.url, cfg.pool, cfg.token, timeout_ms=2000, retries=0,
                                  client_name="kvpool-cluster fill")
        self.put: Optional[kvpool.Client] = None
        self.region: Optional[kvpool.Region] = None
        self.workers: list[StoreWorker] = []
        self._tfd = -1
        try:
            self.put = kvpool.Client(cfg.url, cfg.pool, cfg.token, timeout_ms=2000, retries=0,
                                     client_name="kvpool-cluster put")
            self.region = self.fill.region()
            self.epoch = int(self.fill.info["event_epoch"])
            self.key_len = self.fill.key_len
            # Trailers: slots [0, batch) for fills, [batch, 2 batch) for puts.
            self._tfd = os.memfd_create("kvpool-cluster-trailers")
            size = 2 * cfg.batch * TRAILER
            os.ftruncate(self._tfd, size)
            self.trailers = mmap.mmap(self._tfd, size, mmap.MAP_SHARED)
            r, fd = self.region, self.region.ref().fd
            args = (fd, r.bytes, r.row_stride, self._tfd, size)
            self.fill_store = StoreWorker(cfg.store, "fill worker", 0, *args,
                                          timeout_s=cfg.store.timeout_s)
            self.workers.append(self.fill_store)
            self.put_store = StoreWorker(cfg.store, "put worker", cfg.store.segment_bytes,
                                         *args, timeout_s=cfg.store.put_timeout_s)
            self.workers.append(self.put_store)
            self.log_store = StoreWorker(cfg.store, "log worker", 0, *args,
                                         timeout_s=cfg.store.put_timeout_s)
            self.workers.append(self.log_store)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for w in self.workers:  # first: once they are gone nothing touches the rows
            w.close()
        for c in (self.fill, self.put):
            try:
                if c is not None:
                    c.close()
            except kvpool.KvpoolError:
                pass
        if self.region is not None:
            self.region.close()
        if self._tfd >= 0:
            os.close(self._tfd)
            self._tfd = -1


class ClusterTier:
    """The agent (see the module's doc). start() runs both loops on threads;
    stop() ends them. stats counts what happened."""

    def __init__(self, cfg: TierConfig) -> None:
        for what, addr in (("host", cfg.store.host), ("master", cfg.store.master),
                           ("metadata", cfg.store.metadata)):
            if not cfg.allow_public and not private_address(addr):
                raise ValueError(f"kvpool cluster: the {what} address {addr} is not private: "
                                 "Mooncake Store has no authentication, so the tier runs on a "
                                 "private network only (allow_public / --allow-public-address "
                                 "to override, docs/operations.md)")
        self.cfg = cfg
        self.stats = dict(filled=0, absent=0, corrupt=0, fill_errors=0, put=0, put_errors=0,
                          dropped=0, store_down=0, node_restarts=0, waiting_hits=0, cold=0,
                          gone=0, announced=0, evicted=0, pinned=0, pinned_put=0)
        self._stop = threading.Event()
        self._node = _Node(cfg)
        reg = cast(kvpool.Region, self._node.region)
        self.ns = Namespace(cfg.tenant, cfg.model, cfg.layout, reg.row_bytes, reg.shards,
                            self._node.key_len)
        self._filled = Recent(1 << 16)   # keys this agent filled: already in the store
        self._put = Recent(1 << 16)      # keys this agent put
        # The fleet's announcement log (cluster_log.py): what this node's
        # kvpoold announces the cluster holds.
        self.fleet = FleetEvents(self.ns, cfg.audit_s)
        self._put_restarts = 0
        try:
            self._pins = PinSet(self._load_pins() if cfg.pin_file else [], cfg.pin_sweep_s)
        except BaseException:
            self._node.close()
            raise
        self.stats["pinned"] = len(self._pins)
        self._todo: deque[bytes] = deque()  # committed keys to put
        # The hits policy's committed keys waiting for their hits: key ->
        # (when it came, when to look next), in the order of the next look.
        self._waiting: OrderedDict[bytes, tuple[float, float]] = OrderedDict()
        self._node_lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def store_up(self) -> bool:
        return all(w.up() for w in self._node.workers)

    def store_counts(self) -> dict[str, int]:
        w = self._node.workers
        return dict(store_timeouts=sum(x.timeouts for x in w),
                    store_restarts=sum(x.restarts for x in w))

    # ---- the agent's life ----
    def start(self) -> "ClusterTier":
        loops = [self._fill_loop, self._log_loop] + (
            [self._put_loop] if self.cfg.write_behind else [])
        for fn in loops:
            t = threading.Thread(target=self._guard, args=(fn,), name=f"kvpool-{fn.__name__}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        self._node.close()

    def __enter__(self) -> "ClusterTier":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _guard(self, fn: Any) -> None:
        """Runs a loop; kvpoold gone (a restart) means a new life's region."""
        while not self._stop.is_set():
            try:
                fn()
            except (kvpool.Unavailable, kvpool.Busy, kvpool.Unauthenticated,
                    kvpool.DeadlineExceeded) as e:
                log.warning("kvpool cluster: kvpoold does not answer (%s): following it", e)
                self._stop.wait(0.5)
                try:
                    self._renew_node()
                except Exception as e2:  # noqa: BLE001: tried again after the next failure
                    log.warning("kvpool cluster: following kvpoold failed (%s)", e2)
            except Exception:  # noqa: BLE001: a loop never dies; it says why and goes on
                log.exception("kvpool cluster: %s failed; going on", fn.__name__)
                self._stop.wait(0.5)

    def _renew_node(self) -> None:
        """Sessions, region and store workers of kvpoold's new life."""
        with self._node_lock:
            old = self._node
            with kvpool.Client(self.cfg.url, self.cfg.pool, self.cfg.token, timeout_ms=2000,
                               retries=0) as probe:
                if int(probe.info["event_epoch"]) == old.epoch:
                    return
            self._node = _Node(self.cfg)
            self.stats["node_restarts"] += 1
            old.close()
            log.warning("kvpool cluster: kvpoold restarted: following its new region")

    # ---- fill: the store's objects into region rows ----
    def _fill_loop(self) -> None:
        absent: list[bytes] = []
        last_want = 0.0
        while not self._stop.is_set():
            node = self._node
            wants, waiting = node.fill.cluster_fill(absent, self.cfg.batch)
            absent = []
            now = time.monotonic()
            if wants:
                last_want = now
                absent = self._fill(node, wants)
                if waiting:
                    continue  # more are queued: at once
            # A request's keys come a step apart: poll fast while they come.
            hot = now - last_want < self.cfg.hot_s
            self._stop.wait(self.cfg.poll_s if hot else self.cfg.idle_poll_s)

    def _fill(self, node: _Node, wants: list[bytes]) -> list[bytes]:
        """Fills what the store holds; returns the keys to report absent."""
        names = [self.ns.name(k) for k in wants]
        region = cast(kvpool.Region, node.region)
        if not node.fill_store.up():  # no row reserved (and none evicted) for nothing
            self.stats["store_down"] += 1
            self.stats["absent"] += len(wants)
            return wants
        # Keys the fleet's log says the store holds are not looked up first:
        # their get says whether they are there (a miss aborts the row).
        ask = [i for i, k in enumerate(wants) if k not in self.fleet]
        held = [1] * len(wants)
        if ask:
            try:
                out = node.fill_store.call("exists", names=[names[i] for i in ask])
            except StoreDown:
                self.stats["store_down"] += 1
                self.stats["absent"] += len(wants)
                return wants
            if out and all(h < 0 for h in out):  # the store answers nothing: a new client
                node.fill_store.restart(f"every lookup failed ({out[0]})")
            for i, h in zip(ask, out):
                held[i] = h
        absent = [k for k, h in zip(wants, held) if h != 1]
        self.fleet.gone([k for k, h in zip(wants, held) if h == 0])
        have = [(k, n) for k, n, h in zip(wants, names, held) if h == 1]
        if not have:
            self.stats["absent"] += len(absent)
            return absent
        try:
            rows, _ = node.fill.reserve([k for k, _ in have])
        except (kvpool.NoSpace, kvpool.QuotaExceeded):
            self.stats["fill_errors"] += 1
            return absent + [k for k, _ in have]
        todo = [(k, n, r) for (k, n), r in zip(have, rows) if r > 0]  # -1: stored meanwhile
        if not todo:
            return absent
        keys = [k for k, _, _ in todo]
        try:
            got = node.fill_store.call("get", names=[n for _, n, _ in todo],
                                       rows=[r for _, _, r in todo],
                                       slots=list(range(len(todo))),
                                       row_bytes=region.row_bytes)
        except StoreDown:  # the worker is gone: nothing writes into the rows any more
            self.stats["store_down"] += 1
            node.fill.abort(keys)
            return absent + keys
        good, crcs, bad, gone = [], [], [], []
        for (k, _, _), n, crc in zip(todo, got, self._check(node, todo, got)):
            if crc is not None:
                good.append(k)
                crcs.append(crc)
            else:
                bad.append(k)
                if n >= 0:
                    self.stats["corrupt"] += 1
                if n >= 0 or n == NOT_FOUND:  # not a failed transfer: the store lacks it
                    gone.append(k)
        if bad:
            node.fill.abort(bad)
            self.fleet.gone(gone)
        if good:
            for k in good:  # before the commit: its BlockStored must find them here
                self._filled.add(k)
            node.fill.commit(good, crcs)
            self.stats["filled"] += len(good)
        self.stats["absent"] += len(absent) + len(bad)
        return absent + bad

    def _check(self, node: _Node, todo: list[tuple[bytes, str, int]],
               got: list[int]) -> list[Optional[int]]:
        """Each filled row's CRC32C when its object is this namespace's for
        its key (trailer) and its bytes have that checksum, else None."""
        region = cast(kvpool.Region, node.region)
        want = region.row_bytes + TRAILER
        out: list[Optional[int]] = []
        for i, ((k, _, r), n) in enumerate(zip(todo, got)):
            trailer = node.trailers[i * TRAILER:(i + 1) * TRAILER]
            crc = check_trailer(self.ns, k, trailer) if n == want else None
            out.append(crc if crc is not None and region.check(r, crc) else None)
        return out

    # ---- write-behind: committed rows into the store ----
    def _put_loop(self) -> None:
        node = self._node
        sub = kvpool.Subscriber(self.cfg.events, self.cfg.url, pools=[self.cfg.pool],
                                token=self.cfg.token, index=False, int_hashes=False,
                                timeout_ms=2000)
        try:
            while not self._stop.is_set() and node is self._node:
                for item in sub.poll(20):
                    self._queue_stored(item)
                if self._pins:
                    self._put_pinned(node)
                if self.cfg.pinned_only:
                    self._todo.clear()  # not pinned: never put
                    continue
                if self.cfg.min_hits > 0:
                    self._put_hit(node)
                    continue
                while self._todo and not self._stop.is_set():
                    keys: list[bytes] = []
                    while self._todo and len(keys) < self.cfg.batch:
                        k = self._todo.popleft()
                        if k not in self._filled and k not in self._put and k not in keys:
                            keys.append(k)
                    if keys:
                        self._put_rows(node, keys)
        finally:
            sub.close()

    # ---- pinned prefixes: put whatever the policy, soft-pinned ----
    def _load_pins(self) -> list[bytes]:
        info = self._node.fill.info
        per_hash = int(info["hash_block_size"]) or int(info["block_size"])
        if int(info["block_size"]) % per_hash:
            raise ValueError(f"kvpool cluster: the pool's rows of {info['block_size']} tokens "
                             f"are not whole hash blocks of {per_hash}")
        hasher = kvpool.Hasher(self.cfg.pin_seed or kvpool.Hasher.DEFAULT_SEED,
                               str(info["hash_algorithm"]))
        pins = load_pins(cast(str, self.cfg.pin_file), hasher, per_hash,
                         int(info["block_size"]) // per_hash, self.cfg.pin_groups)
        log.info("kvpool cluster: %d pinned keys from %s", len(pins), self.cfg.pin_file)
        return pins

    def _put_pinned(self, node: _Node) -> None:
        """Pinned rows go at once, soft-pinned, unless the store has them
        (PinSet.due: committed ones, and a sweep of the rest)."""
        keys, self._todo = self._pins.due(self._todo)
        keys = [k for k in keys
                if k not in self._filled and k not in self._put and k not in self.fleet]
        for i in range(0, len(keys), self.cfg.batch):
            self._put_rows(node, keys[i:i + self.cfg.batch], pin=True)

    def _put_hit(self, node: _Node) -> None:
        """The hits policy: committed keys wait (queue of them at most, each
        up to hits_window_s) until engines' lookups hit their row min_hits
        times; each is looked at (uncounted) at most every hits_look_s, a
        batch a loop. A row evicted meanwhile is gone; one still short of
        its hits at the window's end is cold; both are never put."""
        now, look = time.monotonic(), self.cfg.hits_look_s
        wait = self._waiting
        while self._todo:
            k = self._todo.popleft()
            if k in self._filled or k in self._put or k in wait:
                continue
            if len(wait) >= self.cfg.queue:
                wait.popitem(last=False)
                self.stats["dropped"] += 1
            wait[k] = (now, now + look)
        keys: list[bytes] = []
        for k, (_, t) in wait.items():  # in the order of their next look
            if t > now or len(keys) == self.cfg.batch:
                break
            keys.append(k)
        self.stats["waiting_hits"] = len(wait)
        if not keys:
            return
        put = cast(kvpool.Client, node.put)
        rows, crcs, hits = put.lookup_and_lock_uncounted(keys)
        hot: list[tuple[bytes, int, int]] = []
        short: list[bytes] = []
        for k, r, c, h in zip(keys, rows, crcs, hits):
            born, _ = wait.pop(k)
            if r <= 0:
                self.stats["gone"] += 1
            elif h >= self.cfg.min_hits:
                hot.append((k, r, c))
            else:
                short.append(k)
                if now - born < self.cfg.hits_window_s:
                    wait[k] = (born, now + look)
                else:
                    self.stats["cold"] += 1
        if short:
            put.unlock(short)
        if hot:
            self._put_held(node, hot)

    def _queue_stored(self, item: Any) -> None:
        if isinstance(item, Reset):
            keys = [h + g.to_bytes(4, "big") for (h, g) in item.entries]
        else:
            # The pool's own rows only: a disk tier below it tells its rows in
            # vLLM's STORAGE medium, and those are not in the region to put;
            # the cluster's blocks (CLUSTER) are in the store already.
            keys = [bytes(h) + (ev.group_idx or 0).to_bytes(4, "big")
                    for ev in item.events
                    if isinstance(ev, BlockStored)
                    and ev.medium not in (DISK_MEDIUM, CLUSTER_MEDIUM)
                    for h in ev.block_hashes]
        for k in keys:
            if len(self._todo) >= self.cfg.queue:
                self._todo.popleft()
                self.stats["dropped"] += 1
            self._todo.append(k)

    def _put_rows(self, node: _Node, keys: list[bytes], pin: bool = False) -> None:
        put = cast(kvpool.Client, node.put)
        rows, crcs, _ = put.lookup_and_lock_uncounted(keys)  # not an engine's hit
        held = [(k, r, c) for k, r, c in zip(keys, rows, crcs) if r > 0]
        if held:
            self._put_held(node, held, pin)

    def _put_held(self, node: _Node, held: list[tuple[bytes, int, int]],
                  pin: bool = False) -> None:
        """Puts rows this agent holds locked (key, row, CRC), and unlocks them."""
        region, put = cast(kvpool.Region, node.region), cast(kvpool.Client, node.put)
        if node.put_store.restarts != self._put_restarts:  # its segment went with it
            self._put_restarts = node.put_store.restarts
            self._put = Recent(1 << 16)
            self._filled = Recent(1 << 16)
        locked = [k for k, _, _ in held]
        base = self.cfg.batch
        for i, (k, r, c) in enumerate(held):
            at = (base + i) * TRAILER
            node.trailers[at:at + TRAILER] = pack_trailer(self.ns, k, c or region.crc(r))
        try:
            out = node.put_store.call("put", names=[self.ns.name(k) for k in locked],
                                      rows=[r for _, r, _ in held],
                                      slots=[base + i for i in range(len(held))],
                                      row_bytes=region.row_bytes, pin=pin)
        except StoreDown:  # the worker is gone: the rows are free to go; the keys wait
            self.stats["store_down"] += 1
            put.unlock(locked)
            self._todo.extendleft(reversed(locked))
            while len(self._todo) > self.cfg.queue:
                self._todo.pop()
                self.stats["dropped"] += 1
            self._stop.wait(0.1)
            return
        put.unlock(locked)
        if out and all(rc < 0 for rc in out):  # the store answers nothing: a new client
            node.put_store.restart(f"every put failed ({out[0]})")
        stored = []
        for k, rc in zip(locked, out):
            if rc == 0:
                self._put.add(k)
                stored.append(k)
                self.stats["put"] += 1
                self.stats["pinned_put"] += pin
            else:
                self.stats["put_errors"] += 1
        self.fleet.put(stored)

    # ---- events: what the cluster holds, told to every node's routers ----
    def _log_loop(self) -> None:
        """The fleet's events (cluster_log.FleetEvents): what this agent
        learned written to the log, what the log says handed to kvpoold,
        which publishes it as medium CLUSTER events for this node's engines;
        a new kvpoold life is told every block announced so far."""
        told: Optional[_Node] = None
        while not self._stop.is_set():
            node = self._node
            if node is not told:
                self.fleet.retell(node.fill)
                told = node
            try:
                self.fleet.step(node.fill, node.log_store, self._put.keys)
            except StoreDown:
                self.stats["store_down"] += 1
            self.stats.update(announced=len(self.fleet.announced), evicted=self.fleet.evicted)
            self._stop.wait(self.cfg.log_poll_s)


def _parse(argv: Optional[list[str]]) -> tuple[TierConfig, Optional[str]]:
    p = argparse.ArgumentParser(prog="python -m kvpool.cluster",
                                description="kvpool's cluster tier agent (docs/cluster.md)")
    p.add_argument("--url", required=True, help="kvpoold's rpc url on this host (ipc://...)")
    p.add_argument("--events", required=True, help="kvpoold's event stream url")
    p.add_argument("--pool", default="default")
    p.add_argument("--token-file", help="the pool's token")
    p.add_argument("--master", required=True, help="mooncake_master's host:port")
    p.add_argument("--metadata", required=True, help="its metadata url (http://host:port/metadata)")
    p.add_argument("--host", required=True, help="this node's address on the store's network")
    p.add_argument("--segment-mib", type=int, default=1024, help="memory lent to the store")
    p.add_argument("--tenant", default="default")
    p.add_argument("--model", required=True, help="the model whose KV the pool holds")
    p.add_argument("--layout", required=True,
                   help="the KV layout (dtype, heads, head size, layers, block size, TP shard)")
    p.add_argument("--timeout-ms", type=int, default=500, help="one store lookup or get at most")
    p.add_argument("--write-behind", default="all", metavar="POLICY",
                   help="which committed rows go to the store: all (default), hits:N (rows "
                   "engines' lookups hit N times since their commit, within --hits-window-s), "
                   "pinned (only --pin-file's prefixes) or none (fill only); pinned prefixes "
                   "go under every policy but none")
    p.add_argument("--pin-file", help="pinned prefixes: a JSON prompt a line (token ids, or "
                   "an object with tokens, lora_name, lora_path, cache_salt), put as soon as "
                   "this node holds them, soft-pinned in the store")
    p.add_argument("--pin-hash-seed", help="the engines' PYTHONHASHSEED, if they set one "
                   "(the pinned prompts' hashes must be theirs)")
    p.add_argument("--pin-groups", default="0",
                   help="the KV cache groups whose keys a pinned prompt has (default 0)")
    p.add_argument("--hits-window-s", type=float, default=600.0,
                   help="how long a committed row may wait for its hits (hits:N)")
    p.add_argument("--no-write-behind", action="store_true", help="fill only (--write-behind none)")
    p.add_argument("--audit-s", type=float, default=10.0,
                   help="between looks (1,024 keys each) at whether the store still holds "
                   "this node's puts; those it lost are retracted from every node's events")
    p.add_argument("--stats-file", help="a JSON file of the agent's counters, rewritten each "
                   "half second (for a node exporter's textfile collector or a test)")
    p.add_argument("--allow-public-address", action="store_true",
                   help="run on a non-private network (the store has no authentication)")
    a = p.parse_args(argv)
    policy, min_hits = a.write_behind, 0
    if policy.startswith("hits:") and policy[5:].isdigit() and int(policy[5:]) >= 1:
        min_hits = int(policy[5:])
    elif policy not in ("all", "none", "pinned"):
        p.error(f"--write-behind {policy}: all, hits:N (N 1 or more), pinned or none")
    if policy == "pinned" and not a.pin_file:
        p.error("--write-behind pinned needs --pin-file")
    if a.pin_file and (policy == "none" or a.no_write_behind):
        p.error("--pin-file needs write-behind (its prefixes are put): not with none")
    try:
        pin_groups = tuple(int(g) for g in a.pin_groups.split(","))
    except ValueError:
        p.error(f"--pin-groups {a.pin_groups}: group numbers, comma-separated")
    if any(not 0 <= g < 1 << 32 for g in pin_groups):
        p.error(f"--pin-groups {a.pin_groups}: group numbers are 0 to 2^32 - 1")
    if not a.hits_window_s > 0:
        p.error("--hits-window-s must be positive")
    if not a.audit_s > 0:
        p.error("--audit-s must be positive")
    token = None
    if a.token_file:
        with open(a.token_file) as f:
            token = f.read().strip()
    return TierConfig(url=a.url, events=a.events, pool=a.pool, token=token, tenant=a.tenant,
                      model=a.model, layout=a.layout,
                      write_behind=not a.no_write_behind and policy != "none",
                      min_hits=min_hits, hits_window_s=a.hits_window_s,
                      pinned_only=policy == "pinned", pin_file=a.pin_file,
                      pin_seed=a.pin_hash_seed, pin_groups=pin_groups, audit_s=a.audit_s,
                      allow_public=a.allow_public_address,
                      store=StoreConfig(master=a.master, metadata=a.metadata, host=a.host,
                                        segment_bytes=a.segment_mib << 20,
                                        timeout_s=a.timeout_ms / 1000)), a.stats_file


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg, stats_file = _parse(argv)
        tier = ClusterTier(cfg)
    except (ValueError, OSError, kvpool.KvpoolError) as e:
        print(f"kvpool cluster: {e}", file=sys.stderr)
        return 2
    done = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: done.set())
    tier.start()
    log.info("kvpool cluster: pool %s at %s joined the store at %s as %s (namespace %s)",
             cfg.pool, cfg.url, cfg.store.master, cfg.store.host, tier.ns.digest[:8].hex())
    last = time.monotonic()
    while not done.wait(0.5):
        if stats_file:
            _write_stats(stats_file, tier)
        if time.monotonic() - last >= 30:
            last = time.monotonic()
            log.info("kvpool cluster: %s", " ".join(f"{k}={v}" for k, v in tier.stats.items()))
    tier.stop()
    return 0


def _write_stats(path: str, tier: ClusterTier) -> None:
    st = dict(tier.stats, **tier.fleet.log.stats, log_pending=tier.fleet.log.pending(),
              store_up=tier.store_up(), **tier.store_counts(), time=time.time())
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(st, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
