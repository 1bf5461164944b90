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
    unlocked;
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
import ctypes
import logging
import signal
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Optional

import kvpool
from kvpool.events import BlockStored, Reset
from kvpool.cluster_store import (TRAILER, ClusterStore, Namespace, StoreConfig, StoreDown,
                                  check_trailer, pack_trailer, private_address)

log = logging.getLogger("kvpool.cluster")

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
    write_behind: bool = True     # put every committed row (the "all" policy)
    batch: int = 64               # keys per store call
    poll_s: float = 0.002         # between ClusterFill calls while keys wait
    idle_poll_s: float = 0.02     # between them while none did
    queue: int = 65536            # committed keys waiting to be put, at most
    allow_public: bool = False


class _Recent:
    """A bounded set of recent keys (oldest forgotten first)."""

    def __init__(self, cap: int) -> None:
        self._d: OrderedDict[bytes, None] = OrderedDict()
        self._cap = cap

    def add(self, k: bytes) -> None:
        self._d[k] = None
        self._d.move_to_end(k)
        while len(self._d) > self._cap:
            self._d.popitem(last=False)

    def __contains__(self, k: object) -> bool:
        return k in self._d


class _Node:
    """One kvpoold life: a session for each loop, the region, the trailers."""

    def __init__(self, cfg: TierConfig, batch: int) -> None:
        self.fill = kvpool.Client(cfg.url, cfg.pool, cfg.token, timeout_ms=2000, retries=0,
                                  client_name="kvpool-cluster fill")
        try:
            self.put = kvpool.Client(cfg.url, cfg.pool, cfg.token, timeout_ms=2000, retries=0,
                                     client_name="kvpool-cluster put")
            self.region = self.fill.region()
        except BaseException:
            self.fill.close()
            raise
        self.epoch = int(self.fill.info["event_epoch"])
        r = self.region
        self.base = r.address(1) - r.row_stride  # row i at base + i * row_stride
        self.key_len = self.fill.key_len
        # Two trailer areas (fill, put), batch trailers each, registered with the store.
        self.trailers = (ctypes.c_uint8 * (2 * batch * TRAILER))()
        self.trailers_addr = ctypes.addressof(self.trailers)

    def buffers(self) -> list[tuple[int, int]]:
        return [(self.base, self.region.bytes), (self.trailers_addr, len(self.trailers))]

    def close(self) -> None:
        for c in (self.fill, self.put):
            try:
                c.close()
            except kvpool.KvpoolError:
                pass
        self.region.close()


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
                          dropped=0, store_down=0, node_restarts=0)
        self._stop = threading.Event()
        self._node = _Node(cfg, cfg.batch)
        reg = self._node.region
        self.ns = Namespace(cfg.tenant, cfg.model, cfg.layout, reg.row_bytes, reg.shards,
                            self._node.key_len)
        try:
            self.store = ClusterStore(cfg.store, self._node.buffers())
        except BaseException:
            self._node.close()
            raise
        self._filled = _Recent(1 << 16)   # keys this agent filled: already in the store
        self._put = _Recent(1 << 16)      # keys this agent put
        self._todo: deque[bytes] = deque()  # committed keys to put
        self._late: deque[tuple[str, _Node, list[bytes]]] = deque()  # releases after overruns
        self._node_lock = threading.Lock()
        self._retired: list[tuple[ClusterStore, _Node]] = []
        self._threads: list[threading.Thread] = []

    # ---- the agent's life ----
    def start(self) -> "ClusterTier":
        loops = [self._fill_loop] + ([self._put_loop] if self.cfg.write_behind else [])
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
        self.store.close()
        if not self.store.busy():
            self._node.close()
        for store, node in self._retired:
            store.close()
            if not store.busy():
                node.close()

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
                self._renew_node()
            except Exception:  # noqa: BLE001: a loop never dies; it says why and goes on
                log.exception("kvpool cluster: %s failed; going on", fn.__name__)
                self._stop.wait(0.5)

    def _renew_node(self) -> None:
        """A new session pair and region after kvpoold restarted. The old
        region stays mapped until no store call uses it (a stuck get may
        still write into it)."""
        with self._node_lock:
            old = self._node
            try:
                probe = kvpool.Client(self.cfg.url, pool=self.cfg.pool, token=self.cfg.token,
                                      timeout_ms=2000, retries=0)
            except kvpool.KvpoolError:
                return
            try:
                same = int(probe.info["event_epoch"]) == old.epoch
            finally:
                probe.close()
            if same:
                return
            new = _Node(self.cfg, self.cfg.batch)
            try:
                store = ClusterStore(self.cfg.store, new.buffers())
            except BaseException:
                new.close()
                raise
            self._retired.append((self.store, old))
            self.store, self._node = store, new
            self.stats["node_restarts"] += 1
            log.warning("kvpool cluster: kvpoold restarted: following its new region")
        self._close_retired()

    def _close_retired(self) -> None:
        """Closes old lives' stores and regions once no call of theirs is
        stuck: a get that returns late may still write into its rows."""
        for store, node in list(self._retired):
            if not store.busy():
                self._retired.remove((store, node))
                store.close()
                node.close()

    def _release_late(self, node: _Node) -> None:
        """Rows whose store call overran, released now that it returned."""
        while self._late:
            what, n, keys = self._late.popleft()
            if n is not node:
                continue  # that life's session is gone, and its rows with it
            try:
                (n.fill.abort if what == "abort" else n.put.unlock)(keys)
            except kvpool.KvpoolError:
                pass

    # ---- fill: the store's objects into region rows ----
    def _fill_loop(self) -> None:
        absent: list[bytes] = []
        while not self._stop.is_set():
            node = self._node
            self._release_late(node)
            if self._retired:
                self._close_retired()
            wants, _ = node.fill.cluster_fill(absent, self.cfg.batch)
            absent = []
            if not wants:
                self._stop.wait(self.cfg.idle_poll_s)
                continue
            absent = self._fill(node, wants)
            self._stop.wait(self.cfg.poll_s)

    def _fill(self, node: _Node, wants: list[bytes]) -> list[bytes]:
        """Fills what the store holds; returns the keys to report absent."""
        names = [self.ns.name(k) for k in wants]
        try:
            held = self.store.exists(names)
        except StoreDown:
            self.stats["store_down"] += 1
            self.stats["absent"] += len(wants)
            return wants
        absent = [k for k, h in zip(wants, held) if h != 1]
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
        t0 = node.trailers_addr
        ptrs = [[node.base + r * node.region.row_stride, t0 + i * TRAILER]
                for i, (_, _, r) in enumerate(todo)]
        sizes = [[node.region.row_bytes, TRAILER]] * len(todo)
        keys = [k for k, _, _ in todo]

        def late() -> None:  # the get returned after its deadline: now the rows can go
            self._late.append(("abort", node, keys))
        try:
            got = self.store.get_into([n for _, n, _ in todo], ptrs, sizes, late=late)
        except StoreDown as e:
            self.stats["store_down"] += 1
            if not e.pending:  # else the rows stay reserved until the get returns (late)
                node.fill.abort(keys)
            return absent + keys
        good, crcs, bad = [], [], []
        want = node.region.row_bytes + TRAILER
        for i, ((k, _, r), n) in enumerate(zip(todo, got)):
            trailer = ctypes.string_at(t0 + i * TRAILER, TRAILER)
            crc = check_trailer(self.ns, k, trailer) if n == want else None
            if crc is not None and node.region.check(r, crc):
                good.append(k)
                crcs.append(crc)
            else:
                bad.append(k)
                if n >= 0:
                    self.stats["corrupt"] += 1
        if bad:
            node.fill.abort(bad)
        if good:
            node.fill.commit(good, crcs)
            for k in good:
                self._filled.add(k)
            self.stats["filled"] += len(good)
        self.stats["absent"] += len(absent) + len(bad)
        return absent + bad

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

    def _queue_stored(self, item: Any) -> None:
        if isinstance(item, Reset):
            keys = [h + g.to_bytes(4, "big") for (h, g) in item.entries]
        else:
            keys = [bytes(h) + (ev.group_idx or 0).to_bytes(4, "big")
                    for ev in item.events if isinstance(ev, BlockStored)
                    for h in ev.block_hashes]
        for k in keys:
            if len(self._todo) >= self.cfg.queue:
                self._todo.popleft()
                self.stats["dropped"] += 1
            self._todo.append(k)

    def _put_rows(self, node: _Node, keys: list[bytes]) -> None:
        rows, crcs = node.put.lookup_and_lock(keys)
        held = [(k, r, c) for k, r, c in zip(keys, rows, crcs) if r > 0]
        if not held:
            return
        locked = [k for k, _, _ in held]
        t0 = node.trailers_addr + self.cfg.batch * TRAILER
        for i, (k, r, c) in enumerate(held):
            ctypes.memmove(t0 + i * TRAILER, pack_trailer(self.ns, k, c or node.region.crc(r)),
                           TRAILER)
        ptrs = [[node.base + r * node.region.row_stride, t0 + i * TRAILER]
                for i, (_, r, _) in enumerate(held)]
        sizes = [[node.region.row_bytes, TRAILER]] * len(held)

        def late() -> None:  # the put returned after its deadline: now the locks can go
            self._late.append(("unlock", node, locked))
        try:
            out = self.store.put_from([self.ns.name(k) for k in locked], ptrs, sizes, late=late)
        except StoreDown as e:
            self.stats["store_down"] += 1
            if not e.pending:  # else locked until the put returns (late)
                node.put.unlock(locked)
            return
        node.put.unlock(locked)
        for k, rc in zip(locked, out):
            if rc == 0:
                self._put.add(k)
                self.stats["put"] += 1
            else:
                self.stats["put_errors"] += 1


def _parse(argv: Optional[list[str]]) -> TierConfig:
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
    p.add_argument("--no-write-behind", action="store_true", help="fill only")
    p.add_argument("--allow-public-address", action="store_true",
                   help="run on a non-private network (the store has no authentication)")
    a = p.parse_args(argv)
    token = None
    if a.token_file:
        with open(a.token_file) as f:
            token = f.read().strip()
    return TierConfig(url=a.url, events=a.events, pool=a.pool, token=token, tenant=a.tenant,
                      model=a.model, layout=a.layout, write_behind=not a.no_write_behind,
                      allow_public=a.allow_public_address,
                      store=StoreConfig(master=a.master, metadata=a.metadata, host=a.host,
                                        segment_bytes=a.segment_mib << 20,
                                        timeout_s=a.timeout_ms / 1000))


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = _parse(argv)
        tier = ClusterTier(cfg)
    except (ValueError, OSError, StoreDown, kvpool.KvpoolError) as e:
        print(f"kvpool cluster: {e}", file=sys.stderr)
        return 2
    done = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: done.set())
    tier.start()
    log.info("kvpool cluster: pool %s at %s joined the store at %s as %s (namespace %s)",
             cfg.pool, cfg.url, cfg.store.master, cfg.store.host, tier.ns.digest[:8].hex())
    last = time.monotonic()
    while not done.wait(1.0):
        if time.monotonic() - last >= 30:
            last = time.monotonic()
            log.info("kvpool cluster: %s", " ".join(f"{k}={v}" for k, v in tier.stats.items()))
    tier.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
