# SPDX-License-Identifier: Apache-2.0
"""The fleet's record of what the cluster store holds, kept in the store
itself, so every node's kvpoold can tell its routers (docs/cluster.md,
"Events").

Mooncake Store tells no one what it holds: a block node A put is loadable
by every node, but only A knows it is there. So each agent appends what it
learns (the keys it put; the keys a fill found gone) to one log of small
objects in the store, under the namespace's prefix:

    kvpool/<tenant>/<namespace>/log/<seq>     one entry: up to 1,024 keys
    kvpool/<tenant>/<namespace>/log/head      a recent seq (a start hint)

and every agent, the writer included, reads the log in order and hands the
keys to its own kvpoold (ClusterFill's stored/removed keys), which publishes
them as BlockStored / BlockRemoved of medium CLUSTER to the node's engines'
pods. A router thus credits every node with every block the cluster holds.

Appending needs no coordinator: Mooncake's put of a name that exists
succeeds without writing, so a writer puts its entry at the next seq and
reads it back; if the bytes are another writer's, it tries the next seq.
An entry carries the namespace digest and its writer's nonce; a reader
skips anything else. A seq that stays empty while later ones exist (a
writer died between its claim and its put, or the store evicted the entry)
is skipped after gap_s. A writer removes its entries after keep_s; a
reader more than keep_s behind loses those (a router then learns of those
blocks when a node fills them). A new agent starts reading at the head:
what the fleet put before it joined is not announced by its node.

FleetEvents keeps one node's side of it: the keys its kvpoold announces,
what this agent learned (its puts, the keys its fills found gone), and an
audit: every audit_s it asks the store about the next keys this agent put
(per_audit of them, in turn) and retracts those the store no longer holds
(evicted, or gone with a node's segment), so a block's removal reaches
routers even if no node asks for it again.
"""
from __future__ import annotations

import base64
import os
import struct
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Optional

from kvpool.cluster_store import Namespace

_MAGIC = b"KVPL"
_VERSION = 1
_HDR = "<4sI32s16sII"  # magic, version, namespace digest, writer nonce, stored, removed
_HDR_LEN = struct.calcsize(_HDR)
ENTRY_KEYS = 1024      # keys an entry holds at most
_PROBE = 8             # seqs a read looks at per call
_CLAIM_TRIES = 32      # seqs a write tries before it gives up (the entry waits)
ANNOUNCE_CALL = 256    # keys per ClusterFill that announces

__all__ = ["AnnounceLog", "FleetEvents", "Recent", "pack_entry", "unpack_entry"]


class Recent:
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

    def discard(self, k: bytes) -> None:
        self._d.pop(k, None)

    def __len__(self) -> int:
        return len(self._d)

    def keys(self) -> list[bytes]:
        return list(self._d)


def pack_entry(ns: Namespace, nonce: bytes, stored: list[bytes], removed: list[bytes]) -> bytes:
    return (struct.pack(_HDR, _MAGIC, _VERSION, ns.digest, nonce, len(stored), len(removed))
            + b"".join(stored) + b"".join(removed))


def unpack_entry(ns: Namespace, data: bytes) -> Optional[tuple[list[bytes], list[bytes]]]:
    """(stored, removed) of an entry of this namespace; None for anything
    else (another namespace's, a torn or foreign object)."""
    if len(data) < _HDR_LEN:
        return None
    magic, ver, digest, _, n_s, n_r = struct.unpack_from(_HDR, data)
    kl = ns.key_len
    if (magic != _MAGIC or ver != _VERSION or digest != ns.digest
            or len(data) != _HDR_LEN + (n_s + n_r) * kl):
        return None
    keys = [data[i:i + kl] for i in range(_HDR_LEN, len(data), kl)]
    return keys[:n_s], keys[n_s:]


class AnnounceLog:
    """One agent's view of the log: what it has yet to write, and where it
    reads next. tell() may be called from any thread; one thread calls
    write() and read()."""

    def __init__(self, ns: Namespace, *, max_pending: int = 65536, gap_s: float = 2.0,
                 keep_s: float = 60.0) -> None:
        self.ns = ns
        self.nonce = os.urandom(16)
        self.max_pending, self.gap_s, self.keep_s = max_pending, gap_s, keep_s
        self._prefix = f"kvpool/{ns.tenant}/{ns.digest[:8].hex()}/log/"
        self._pending: deque[tuple[bool, bytes]] = deque()  # (stored?, key), in order
        self._lock = threading.Lock()  # over _pending
        self.next: Optional[int] = None  # the next seq to read; None: from the head
        self._claim = 0                  # the next seq to try to write at
        self._gap_since: Optional[float] = None
        self._mine: deque[tuple[float, int]] = deque()  # (when, seq) this agent wrote
        self.stats = dict(log_written=0, log_read=0, log_skipped=0, log_dropped=0,
                          log_foreign=0)

    def name(self, seq: int) -> str:
        return f"{self._prefix}{seq}"

    @property
    def head_name(self) -> str:
        return f"{self._prefix}head"

    def tell(self, stored: Any = (), removed: Any = ()) -> None:
        """Queues keys to write (bounded: the oldest go first, counted)."""
        with self._lock:
            for flag, keys in ((True, stored), (False, removed)):
                for k in keys:
                    if len(self._pending) >= self.max_pending:
                        self._pending.popleft()
                        self.stats["log_dropped"] += 1
                    self._pending.append((flag, bytes(k)))

    def pending(self) -> int:
        return len(self._pending)

    # ---- writing: worker is a StoreWorker (cluster_store.py) ----
    def write(self, worker: Any) -> None:
        """Writes what is queued, an entry at a time; raises StoreDown with
        the unwritten keys still queued."""
        while True:
            with self._lock:
                batch = [self._pending.popleft()
                         for _ in range(min(ENTRY_KEYS, len(self._pending)))]
            if not batch:
                break
            stored = [k for s, k in batch if s]
            removed = [k for s, k in batch if not s]
            data = pack_entry(self.ns, self.nonce, stored, removed)
            try:
                written = self._append(worker, data)
            except BaseException:
                self._requeue(batch)
                raise
            if not written:  # every seq tried was taken: again on the next call
                self._requeue(batch)
                return
        self._forget_old(worker)

    def _requeue(self, batch: list[tuple[bool, bytes]]) -> None:
        with self._lock:
            self._pending.extendleft(reversed(batch))
            while len(self._pending) > self.max_pending:
                self._pending.pop()
                self.stats["log_dropped"] += 1

    def _append(self, worker: Any, data: bytes) -> bool:
        b64 = base64.b64encode(data).decode()
        seq = max(self._claim, self._start(worker))
        for _ in range(_CLAIM_TRIES):
            name = self.name(seq)
            worker.call("blob_put", names=[name], data=[b64])
            got = worker.call("blob_get", names=[name])[0]
            if got == b64:
                self._claim = seq + 1
                self._mine.append((time.monotonic(), seq))
                worker.call("blob_upsert", names=[self.head_name], data=[
                    base64.b64encode(str(seq).encode()).decode()])
                self.stats["log_written"] += 1
                return True
            seq += 1
        self._claim = seq
        return False

    def _start(self, worker: Any) -> int:
        """Where this agent reads next; at first, just after the head (what
        it writes itself comes after that, so it reads its own entries)."""
        if self.next is None:
            self.next = self._head(worker) + 1
        return self.next

    def _head(self, worker: Any) -> int:
        raw = base64.b64decode(worker.call("blob_get", names=[self.head_name])[0])
        return int(raw) if raw.isdigit() else 0

    def _forget_old(self, worker: Any) -> None:
        """Removes this agent's entries older than keep_s (a refusal, say
        the object is still leased, is tried again on a later call)."""
        old: list[int] = []
        now = time.monotonic()
        while self._mine and now - self._mine[0][0] > self.keep_s and len(old) < 64:
            old.append(self._mine.popleft()[1])
        if old:
            out = worker.call("blob_remove", names=[self.name(s) for s in old])
            for s, rc in zip(old, out):
                if rc != 0 and rc != -704:  # not gone yet: once more, later
                    self._mine.append((now - self.keep_s + 5.0, s))

    # ---- reading ----
    def read(self, worker: Any) -> list[tuple[list[bytes], list[bytes]]]:
        """The entries after the last read, in order; [] when none."""
        nxt = self._start(worker)
        out = []
        try:
            while True:
                names = [self.name(nxt + i) for i in range(_PROBE)]
                got = [base64.b64decode(x) if x else b""
                       for x in worker.call("blob_get", names=names)]
                took = 0
                for data in got:
                    if not data:
                        break
                    entry = unpack_entry(self.ns, data)
                    if entry is None:
                        self.stats["log_foreign"] += 1
                    else:
                        out.append(entry)
                        self.stats["log_read"] += 1
                    took += 1
                nxt += took
                if took == len(got):
                    continue  # all present: more may follow
                if took > 0 or not any(got[took:]):
                    self._gap_since = None
                    return out
                if not self._skip_gap():
                    return out
                nxt += 1
        finally:
            self.next = nxt

    def _skip_gap(self) -> bool:
        """The next seq is empty while a later one is not: True once that has
        lasted gap_s (a writer that died mid-claim, or an evicted entry)."""
        now = time.monotonic()
        if self._gap_since is None:
            self._gap_since = now
        if now - self._gap_since < self.gap_s:
            return False
        self._gap_since = None
        self.stats["log_skipped"] += 1
        return True


class FleetEvents:
    """One node's part in the fleet's events (see the module's doc): the
    keys its kvpoold announces as held by the cluster (the last 65,536), in
    step with the log. put() and gone() may be called from any thread; one
    thread calls retell() and step()."""

    def __init__(self, ns: Namespace, audit_s: float = 10.0, per_audit: int = 1024) -> None:
        self.log = AnnounceLog(ns)
        self.ns = ns
        self.announced = Recent(1 << 16)
        self.audit_s, self.per_audit = audit_s, per_audit
        self._next_audit = time.monotonic() + audit_s
        self._audit_at = 0
        self.evicted = 0  # keys an audit found the store no longer holds

    def __contains__(self, k: object) -> bool:
        return k in self.announced

    def put(self, keys: list[bytes]) -> None:
        """Keys this agent put into the store."""
        self.log.tell(stored=keys)

    def gone(self, keys: list[bytes]) -> None:
        """Keys the store lacks (a fill or an audit found so): the fleet is
        told those it was told the cluster holds."""
        gone = [k for k in keys if k in self.announced]
        if gone:
            self.log.tell(removed=gone)

    def retell(self, client: Any) -> None:
        """A new kvpoold life: every key announced so far, again."""
        keys = self.announced.keys()
        for i in range(0, len(keys), ANNOUNCE_CALL):
            client.cluster_announce(stored=keys[i:i + ANNOUNCE_CALL])

    def step(self, client: Any, worker: Any, own_puts: Callable[[], list[bytes]]) -> None:
        """One round: the audit when due, then the log written and read, and
        what it says handed to kvpoold (client). Raises StoreDown (the
        worker's) with nothing lost: unwritten keys stay queued, unread
        entries stay in the store."""
        if time.monotonic() >= self._next_audit:
            self._next_audit = time.monotonic() + self.audit_s
            self._audit(worker, [k for k in own_puts() if k in self.announced])
        self.log.write(worker)
        for stored, removed in self.log.read(worker):
            # Each block once: several nodes may put, or find gone, one key.
            stored = [k for k in dict.fromkeys(stored) if k not in self.announced]
            removed = [k for k in dict.fromkeys(removed) if k in self.announced]
            for k in stored:
                self.announced.add(k)
            for k in removed:
                self.announced.discard(k)
            for i in range(0, max(len(stored), len(removed)), ANNOUNCE_CALL):
                client.cluster_announce(stored[i:i + ANNOUNCE_CALL], removed[i:i + ANNOUNCE_CALL])

    def _audit(self, worker: Any, keys: list[bytes]) -> None:
        if not keys:
            return
        at = self._audit_at % len(keys)
        batch = (keys[at:] + keys[:at])[:self.per_audit]
        self._audit_at = at + len(batch)
        held = worker.call("exists", names=[self.ns.name(k) for k in batch])
        gone = [k for k, h in zip(batch, held) if h == 0]  # an error is no answer
        self.evicted += len(gone)
        self.gone(gone)
