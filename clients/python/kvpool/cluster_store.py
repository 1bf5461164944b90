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
- Nothing waits on the store past its deadline. Mooncake's client holds
  Python's GIL inside some calls (its setup blocks every thread of the
  process for tens of seconds while the master is down), so it never runs
  in the agent's process: each StoreWorker is a child process with its own
  client, mapping the region and the trailers through descriptors the agent
  passes it, and answering commands on a pipe. A call that overruns its
  deadline kills the child (SIGKILL, waited for): once it is gone nothing
  can write into a row, so the caller releases its rows at once. A new
  child is started in the background, with a backoff from 0.5 s to 5 s,
  and calls fail at once (StoreDown: a miss) meanwhile.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from typing import IO, Any, Optional, cast

log = logging.getLogger("kvpool.cluster")

TRAILER = 64
_MAGIC = b"KVPC"
_VERSION = 1
_TRAILER_FMT = "<4sI32sIIQ"  # magic, version, namespace digest, key crc, row crc, row bytes
NOT_FOUND = -704  # Mooncake's OBJECT_NOT_FOUND
_BACKOFF_S, _BACKOFF_MAX_S = 0.5, 5.0


class StoreDown(Exception):
    """The store did not answer in time, or is being restarted: a miss.
    The call is over either way (its worker answered or was killed)."""


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
    """Whether host (a name or an address, a port or a URL allowed) is
    loopback, private or link-local: Mooncake Store has no authentication."""
    h = host
    if "//" in h:
        h = h.split("//", 1)[1].split("/", 1)[0]
    if h.startswith("["):
        h = h[1:].split("]", 1)[0]
    elif h.count(":") == 1:
        h = h.rsplit(":", 1)[0]
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
    master: str                   # host:port of mooncake_master's RPC
    metadata: str                 # its metadata server: http://host:port/metadata
    host: str                     # this node's address the other nodes reach
    segment_bytes: int = 1 << 30  # memory this node lends the store (the put worker's)
    buffer_bytes: int = 16 << 20  # each client's own staging buffer
    protocol: str = "tcp"
    timeout_s: float = 0.5        # one lookup or get at most
    put_timeout_s: float = 5.0    # one put at most (write-behind: never on a step's path)
    start_timeout_s: float = 15.0  # a worker joining the store at most
    python: str = sys.executable  # the workers' Python (it imports mooncake)


class StoreWorker:
    """One child process with its own Mooncake client (see the module's
    doc). Rows and trailers are named by index; the child maps the region
    (region_fd) and the trailer area (trailers_fd) itself. Thread-safe: one
    call at a time."""

    def __init__(self, cfg: StoreConfig, name: str, segment_bytes: int, region_fd: int,
                 region_bytes: int, row_stride: int, trailers_fd: int, trailers_bytes: int,
                 timeout_s: float) -> None:
        self.cfg, self.name, self.timeout_s = cfg, name, timeout_s
        self._spawn_args = dict(master=cfg.master, metadata=cfg.metadata, host=cfg.host,
                                segment=segment_bytes, buffer=cfg.buffer_bytes,
                                protocol=cfg.protocol, region_fd=region_fd,
                                region_bytes=region_bytes, row_stride=row_stride,
                                trailers_fd=trailers_fd, trailers_bytes=trailers_bytes)
        self._fds = (region_fd, trailers_fd)
        self._lock = threading.Lock()
        self._p: Optional[subprocess.Popen] = None
        self._down_until = 0.0
        self._backoff = _BACKOFF_S
        self._starting = False
        self._closed = False
        self.timeouts = self.restarts = 0
        self._start_async()

    # ---- the child's life ----
    def _start_async(self) -> None:
        with self._lock:
            if self._starting or self._closed:
                return
            self._starting = True
        threading.Thread(target=self._start, name=f"kvpool-{self.name}-start",
                         daemon=True).start()

    def _start(self) -> None:
        while not self._closed:
            pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            path = os.pathsep.join(x for x in (pkg, os.environ.get("PYTHONPATH")) if x)
            p = subprocess.Popen([self.cfg.python, "-m", "kvpool.cluster_store", "--worker",
                                  json.dumps(self._spawn_args)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 pass_fds=self._fds, start_new_session=True,
                                 env=dict(os.environ, PYTHONPATH=path))
            line = _readline(p, self.cfg.start_timeout_s)
            if line is not None and line.get("ready"):
                with self._lock:
                    if self._closed:
                        _kill(p)
                        break
                    self._p, self._down_until, self._backoff = p, 0.0, _BACKOFF_S
                    self._starting = False
                log.info("kvpool cluster: %s joined the store at %s", self.name,
                         self.cfg.master)
                return
            why = (line or {}).get("error", "no answer in time")
            _kill(p)
            log.warning("kvpool cluster: %s could not join the store (%s); again in %.1f s",
                        self.name, why, self._backoff)
            time.sleep(self._backoff)
            self._backoff = min(2 * self._backoff, _BACKOFF_MAX_S)
        with self._lock:
            self._starting = False

    def _fail(self, why: str) -> None:
        """Kills the child (its calls can touch no row after this returns)
        and starts another in the background."""
        with self._lock:
            p, self._p = self._p, None
        if p is not None:
            _kill(p)
            self.restarts += 1
            log.warning("kvpool cluster: %s: %s: restarting it (misses meanwhile)", self.name,
                        why)
        self._start_async()

    def up(self) -> bool:
        return self._p is not None

    def restart(self, why: str) -> None:
        """A new child for one that answers but cannot work (Mooncake's
        client does not recover from a restarted master by itself)."""
        self._fail(why)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            p, self._p = self._p, None
        if p is not None:
            _kill(p)

    # ---- calls ----
    def call(self, op: str, timeout_s: Optional[float] = None, **args: Any) -> list[Any]:
        """The child's answer to one command, or StoreDown (the child killed
        if it overran; nothing it did after counts)."""
        with self._lock:
            p = self._p
            if p is None:
                raise StoreDown(f"{self.name} is not running")
            try:
                w = cast(IO[bytes], p.stdin)
                w.write((json.dumps(dict(args, op=op)) + "\n").encode())
                w.flush()
            except OSError as e:
                ans: Optional[dict] = None
                why = f"its pipe broke ({e})"
            else:
                ans = _readline(p, timeout_s or self.timeout_s)
                why = "no answer in time" if ans is None else ans.get("error", "")
        if ans is None or "out" not in ans:
            if ans is None:
                self.timeouts += 1
            self._fail(why or "a bad answer")
            raise StoreDown(why)
        return list(ans["out"])


def _readline(p: subprocess.Popen, timeout_s: float) -> Optional[dict]:
    """The child's next line as JSON, or None (timeout, exit, garbage)."""
    fd = cast(IO[bytes], p.stdout).fileno()
    deadline = time.monotonic() + timeout_s
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        buf += chunk
    try:
        return json.loads(buf)
    except ValueError:
        return None


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()
    for f in (p.stdin, p.stdout):
        try:
            if f is not None:
                f.close()
        except OSError:
            pass


# ---- the child (python -m kvpool.cluster_store --worker ARGS) ----
def _worker(args: dict) -> None:
    import ctypes
    import mmap

    # The answers go on a private copy of stdout; whatever Mooncake or Python
    # print on descriptor 1 goes to stderr instead, so it cannot garble them.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def say(d: dict) -> None:
        proto.write(json.dumps(d) + "\n")
        proto.flush()
    try:
        from mooncake.store import MooncakeDistributedStore  # type: ignore
    except ImportError as e:
        say({"error": f"no Mooncake client ({e}): pip install mooncake-transfer-engine"})
        return
    region = mmap.mmap(args["region_fd"], args["region_bytes"], mmap.MAP_SHARED)
    trailers = mmap.mmap(args["trailers_fd"], args["trailers_bytes"], mmap.MAP_SHARED)
    rbase = ctypes.addressof(ctypes.c_char.from_buffer(region))
    tbase = ctypes.addressof(ctypes.c_char.from_buffer(trailers))
    stride = args["row_stride"]
    s = MooncakeDistributedStore()
    rc = s.setup(args["host"], args["metadata"], args["segment"], args["buffer"],
                 args["protocol"], "", args["master"])
    if rc != 0:
        say({"error": f"setup failed ({rc})"})
        return
    for addr, size in ((rbase, args["region_bytes"]), (tbase, args["trailers_bytes"])):
        if s.register_buffer(addr, size) != 0:
            say({"error": "register_buffer failed"})
            return
    say({"ready": True})
    for line in sys.stdin:
        try:
            c = json.loads(line)
            op = c["op"]
            if op == "exists":
                res = s.batch_is_exist(c["names"])
            elif op.startswith("blob_"):  # cluster_log.py's small objects, base64
                say({"out": _blob(s, op, c)})
                continue
            else:
                ptrs = [[rbase + r * stride, tbase + t * TRAILER]
                        for r, t in zip(c["rows"], c["slots"])]
                sizes = [[c["row_bytes"], TRAILER]] * len(ptrs)
                if op == "get":
                    res = s.batch_get_into_multi_buffers(c["names"], ptrs, sizes)
                elif op == "put" and c.get("pin"):  # soft-pinned: evicted last
                    from mooncake.store import ReplicateConfig, SoftPinAction  # type: ignore
                    rc = ReplicateConfig()
                    rc.soft_pin_action = SoftPinAction.ENABLE
                    res = s.batch_put_from_multi_buffers(c["names"], ptrs, sizes, rc)
                elif op == "put":
                    res = s.batch_put_from_multi_buffers(c["names"], ptrs, sizes)
                else:
                    raise ValueError(f"unknown op {op!r}")
            say({"out": [int(x) for x in res]})
        except Exception as e:  # noqa: BLE001: a bad command is an answer, not an exit
            say({"error": f"{type(e).__name__}: {e}"})


def _blob(s: Any, op: str, c: dict) -> list:
    """The announcement log's calls (cluster_log.py): small objects as
    base64 text; a missing object reads as ""."""
    import base64
    names = c["names"]
    if op == "blob_get":
        held = s.batch_is_exist(names)
        return [base64.b64encode(bytes(s.get(n))).decode() if h == 1 else ""
                for n, h in zip(names, held)]
    if op == "blob_remove":
        return [int(s.remove(n)) for n in names]
    data = [base64.b64decode(d) for d in c["data"]]
    if op == "blob_put":
        return [int(s.put(n, d)) for n, d in zip(names, data)]
    if op == "blob_upsert":
        return [int(s.upsert(n, d)) for n, d in zip(names, data)]
    raise ValueError(f"unknown op {op!r}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(json.loads(sys.argv[2]))
    else:
        sys.exit("usage: python -m kvpool.cluster_store --worker ARGS (the agent starts it)")
