# SPDX-License-Identifier: Apache-2.0
"""The cluster tier's store: Mooncake Store's own Python client (the
`mooncake-transfer-engine` wheels on PyPI) behind kvpool's deadlines, keys
and checks (docs/cluster.md).

- Keys cannot collide: an object's name is the offload key under a
  namespace digest of tenant, model, KV layout and the region's row
  geometry, and every object ends in a 64-byte trailer (magic, version, the
  whole namespace digest, the key's CRC, the row's CRC32C and length) that
  a fill checks before any byte becomes a row: a torn, foreign or stale
  object is a miss, never KV.
- Nothing waits on the store past its deadline: every store call runs on a
  small pool of threads and the caller waits at most timeout_s. A call
  that overruns keeps its rows (reserved or locked by the caller) until it
  truly returns, since Mooncake may still write into or read from them:
  `late` callbacks release them then. A store that overruns or reports a
  transport error is marked down; calls fail at once (StoreDown) while a
  background thread sets up a new client (Mooncake's does not recover from
  a restarted master by itself), with a backoff from 0.5 s to 5 s.
"""
from __future__ import annotations

import hashlib
import ipaddress
import logging
import socket
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

log = logging.getLogger("kvpool.cluster")

TRAILER = 64
_MAGIC = b"KVPC"
_VERSION = 1
_TRAILER_FMT = "<4sI32sIIQ"  # magic, version, namespace digest, key crc, row crc, row bytes
NOT_FOUND = -704  # Mooncake's OBJECT_NOT_FOUND
_BACKOFF_S, _BACKOFF_MAX_S = 0.5, 5.0


class StoreDown(Exception):
    """The store did not answer in time, or is being reconnected: a miss.
    pending: the call was made and has not returned (its `late` callback
    runs when it does); otherwise the call is over, or was never made."""

    def __init__(self, why: str, pending: bool = False) -> None:
        super().__init__(why)
        self.pending = pending


@dataclass(frozen=True)
class Namespace:
    """Whose bytes an object holds. Two engines share objects only if every
    field is equal: tenant, model, layout (the KV's dtype, heads, head size,
    layers, block size, tensor-parallel shard: whatever makes two rows'
    bytes incompatible), and the region's row geometry and key length."""
    tenant: str
    model: str
    layout: str
    row_bytes: int
    shards: int
    key_len: int

    @property
    def digest(self) -> bytes:
        text = (f"kvpool-cluster/1\ntenant={self.tenant}\nmodel={self.model}\n"
                f"layout={self.layout}\nrow_bytes={self.row_bytes}\nshards={self.shards}\n"
                f"key_len={self.key_len}\n")
        return hashlib.sha256(text.encode()).digest()

    def name(self, key: bytes) -> str:
        """The object's name for an offload key."""
        return f"kvpool/{self.tenant}/{self.digest[:8].hex()}/{key.hex()}"


def pack_trailer(ns: Namespace, key: bytes, crc: int) -> bytes:
    t = struct.pack(_TRAILER_FMT, _MAGIC, _VERSION, ns.digest, zlib.crc32(key), crc,
                    ns.row_bytes)
    return t + b"\0" * (TRAILER - len(t))


def check_trailer(ns: Namespace, key: bytes, trailer: bytes) -> Optional[int]:
    """The row's CRC32C if the trailer is this namespace's for this key, else None."""
    if len(trailer) < struct.calcsize(_TRAILER_FMT):
        return None
    magic, ver, digest, kcrc, crc, n = struct.unpack_from(_TRAILER_FMT, trailer)
    if (magic, ver, digest, kcrc, n) != (_MAGIC, _VERSION, ns.digest, zlib.crc32(key),
                                         ns.row_bytes):
        return None
    return int(crc)


def private_address(host: str) -> bool:
    """Whether host (a name or an address, a port allowed) is loopback,
    private or link-local: Mooncake Store has no authentication."""
    h = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    h = h.strip("[]")
    if "//" in h:
        h = h.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
    try:
        addrs = {ipaddress.ip_address(h)}
    except ValueError:
        try:
            addrs = {ipaddress.ip_address(a[4][0]) for a in socket.getaddrinfo(h, None)}
        except OSError:
            return False
    return all(a.is_private or a.is_loopback or a.is_link_local for a in addrs)


@dataclass
class StoreConfig:
    """Where the store is, and what this node lends it."""
    master: str                 # host:port of mooncake_master's RPC
    metadata: str               # its metadata server: http://host:port/metadata
    host: str                   # this node's address the other nodes reach
    segment_bytes: int = 1 << 30  # memory this node lends the store
    buffer_bytes: int = 16 << 20  # the client's own staging buffer
    protocol: str = "tcp"
    timeout_s: float = 0.5      # one get or lookup at most
    put_timeout_s: float = 5.0  # one put at most (write-behind: never on a step's path)
    workers: int = 4
    setup: Optional[Callable[[], Any]] = field(default=None, repr=False)  # tests: a factory


class ClusterStore:
    """Mooncake Store's client with deadlines and reconnection (see the
    module's doc). buffers: (address, bytes) ranges to register, the
    region's mapping and the caller's trailers."""

    def __init__(self, cfg: StoreConfig, buffers: Sequence[tuple[int, int]]) -> None:
        self.cfg = cfg
        self._buffers = list(buffers)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="kvpool-mc")
        self._store: Any = None
        self._stuck = 0                # calls past their deadline, not yet returned
        self._down_until = 0.0
        self._backoff = _BACKOFF_S
        self._reconnecting = False
        self._closed = False
        self.timeouts = self.errors = self.reconnects = 0
        self._store = self._connect()

    # ---- the client's life ----
    def _connect(self) -> Any:
        if self.cfg.setup is not None:
            return self.cfg.setup()
        from mooncake.store import MooncakeDistributedStore  # type: ignore
        s = MooncakeDistributedStore()
        rc = s.setup(self.cfg.host, self.cfg.metadata, self.cfg.segment_bytes,
                     self.cfg.buffer_bytes, self.cfg.protocol, "", self.cfg.master)
        if rc != 0:
            raise StoreDown(f"Mooncake Store setup failed ({rc}): master {self.cfg.master}, "
                            f"metadata {self.cfg.metadata}")
        for addr, size in self._buffers:
            if s.register_buffer(addr, size) != 0:
                s.close()
                raise StoreDown(f"Mooncake Store refused to register {size} bytes")
        return s

    def _down(self, why: str) -> None:
        """Marks the store down and starts one reconnection in the background."""
        with self._lock:
            now = time.monotonic()
            first = now >= self._down_until and not self._reconnecting
            self._down_until = now + self._backoff
            if self._reconnecting or self._closed:
                return
            self._reconnecting = True
        if first:
            log.warning("kvpool cluster: the store is down (%s): lookups miss and stores are "
                        "skipped until a new client is set up", why)
        threading.Thread(target=self._reconnect, name="kvpool-mc-reconnect", daemon=True).start()

    def _reconnect(self) -> None:
        old = self._store
        while True:
            time.sleep(self._backoff)
            if self._closed:
                break
            try:
                new = self._connect()
            except Exception as e:  # noqa: BLE001: the store's any failure is a retry
                log.info("kvpool cluster: reconnecting to the store failed (%s)", e)
                self._backoff = min(2 * self._backoff, _BACKOFF_MAX_S)
                with self._lock:
                    self._down_until = time.monotonic() + self._backoff
                continue
            with self._lock:
                self._store, self._down_until = new, 0.0
                self._backoff = _BACKOFF_S
                self.reconnects += 1
            log.warning("kvpool cluster: the store answers again (a new client)")
            break
        with self._lock:
            self._reconnecting = False
        if old is not None:  # its calls may still be stuck: close it on its own time
            threading.Thread(target=_quiet_close, args=(old,), daemon=True).start()

    def up(self) -> bool:
        return not self._closed and time.monotonic() >= self._down_until

    def busy(self) -> bool:
        """Whether a call that overran its deadline has not returned yet."""
        return self._stuck > 0

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        s, self._store = self._store, None
        if s is not None and self._stuck == 0:
            _quiet_close(s)

    # ---- calls under a deadline ----
    def _run(self, timeout_s: float, fn: Callable[..., Any], *args: Any,
             late: Optional[Callable[[], None]] = None) -> Any:
        """fn(store, *args) within timeout_s, or StoreDown. On a timeout,
        late() runs when fn truly returns (the caller's rows stay held till
        then); on any other outcome the caller releases them itself."""
        with self._lock:
            if self._closed or time.monotonic() < self._down_until or self._store is None:
                raise StoreDown("the store is down")
            if self._stuck >= self.cfg.workers - 1:  # keep a worker for calls that can answer
                raise StoreDown(f"{self._stuck} store calls have not returned")
            store = self._store
        fut = self._pool.submit(fn, store, *args)
        try:
            return fut.result(timeout=timeout_s)
        except FutureTimeout:
            self.timeouts += 1
            with self._lock:
                self._stuck += 1

            def done(_f: Any) -> None:
                with self._lock:
                    self._stuck -= 1
                if late is not None:
                    late()
            fut.add_done_callback(done)
            self._down(f"a call took over {timeout_s * 1000:.0f} ms")
            raise StoreDown("the store did not answer in time", pending=True) from None
        except StoreDown:
            raise
        except Exception as e:  # noqa: BLE001: the store's exceptions are misses
            self.errors += 1
            self._down(f"{type(e).__name__}: {e}")
            raise StoreDown(str(e)) from e

    def exists(self, names: list[str]) -> list[int]:
        """Per name: 1 held, 0 not held, negative: an error."""
        out = self._run(self.cfg.timeout_s, lambda s, n: list(s.batch_is_exist(n)), names)
        if names and all(r < 0 for r in out):
            self._down(f"lookups failed ({out[0]})")
        return out

    def get_into(self, names: list[str], ptrs: list[list[int]], sizes: list[list[int]],
                 late: Optional[Callable[[], None]] = None) -> list[int]:
        """Each object into its buffers in place: bytes read, or a negative code."""
        out = self._run(self.cfg.timeout_s,
                        lambda s, a, b, c: list(s.batch_get_into_multi_buffers(a, b, c)),
                        names, ptrs, sizes, late=late)
        if names and all(r < 0 and r != NOT_FOUND for r in out):
            self._down(f"gets failed ({out[0]})")
        return out

    def put_from(self, names: list[str], ptrs: list[list[int]], sizes: list[list[int]],
                 late: Optional[Callable[[], None]] = None) -> list[int]:
        """Each object from its buffers in place: 0, or a negative code."""
        out = self._run(self.cfg.put_timeout_s,
                        lambda s, a, b, c: list(s.batch_put_from_multi_buffers(a, b, c)),
                        names, ptrs, sizes, late=late)
        return out


def _quiet_close(s: Any) -> None:
    try:
        s.close()
    except Exception:  # noqa: BLE001: closing a dead client
        pass
