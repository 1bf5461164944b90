# SPDX-License-Identifier: Apache-2.0
"""The shared region: a cpu pool's KV rows, mapped into this process and
written and read in place by key (clients/c/kvpool.h has the contract).

    with kvpool.Client(url, pool="kv", token=t) as c, c.region() as reg:
        key = kvpool.offload_key(block_hash, group=0)
        rows, _ = c.reserve([key])
        reg.row(rows[0])[:] = kv_bytes          # write in place
        c.commit([key])
        rows, crcs = c.lookup_and_lock([key])     # elsewhere: lease the row
        data = reg.row(rows[0])                   # a memoryview, no copy
        c.unlock([key])

A key is vLLM's offload key: the block hash, then the group as 4 big-endian
bytes. Rows are memoryviews into the mapping (numpy.frombuffer and
torch.frombuffer wrap them without a copy). Every process that maps the
region can write every row: check what you load (Region.check) against the
CRC32C recorded at commit when that matters.
"""
from __future__ import annotations

import mmap
import os
import stat
from ctypes import byref, c_int32, c_size_t, c_uint8, c_uint32, c_void_p
from typing import Any, Iterable, NamedTuple, Optional, Sequence, Union

from . import _lib as L

Keys = Union[bytes, bytearray, memoryview, Iterable[bytes]]


def offload_key(block_hash: bytes, group: int = 0) -> bytes:
    """vLLM's offload key: the block hash followed by the group, 4 bytes big-endian."""
    if not 0 <= group < 1 << 32:
        raise ValueError(f"kvpool: group {group} is not a 32-bit unsigned number")
    return bytes(block_hash) + group.to_bytes(4, "big")


def _keys(keys: Keys, key_len: int):
    """(a uint8 array of the packed keys, how many)."""
    if isinstance(keys, (bytes, bytearray, memoryview)):
        raw = bytes(keys)
    else:
        keys = keys if isinstance(keys, list) else list(keys)
        raw = b"".join(keys)
        # every key key_len long: the total is n of them and none is shorter
        if len(raw) != key_len * len(keys) or (keys and min(map(len, keys)) != key_len):
            raise ValueError(f"kvpool: keys must be {key_len} bytes each (the pool's hash and "
                             "a 4-byte group)")
    if len(raw) % key_len:
        raise ValueError(f"kvpool: {len(raw)} bytes of keys is not a multiple of {key_len}")
    return (c_uint8 * max(len(raw), 1)).from_buffer_copy(raw or b"\0"), len(raw) // key_len


class _Rows:
    """Rows and shards of a mapped region (_view, num_rows, row_stride,
    row_bytes, shards, shard_bytes)."""
    _view: Any
    num_rows: int
    row_stride: int
    row_bytes: int
    shards: int
    shard_bytes: int

    def row(self, row: int) -> memoryview:
        """Row `row`'s row_bytes bytes, writable, in place."""
        if not 0 < row < self.num_rows:
            raise IndexError(f"kvpool: row {row} is outside 1..{self.num_rows - 1}")
        off = row * self.row_stride
        return self._view[off:off + self.row_bytes]

    def shard(self, row: int, shard: int) -> memoryview:
        """Shard `shard` of a row: one tensor-parallel worker's slice."""
        if not 0 <= shard < self.shards:
            raise IndexError(f"kvpool: shard {shard} is outside 0..{self.shards - 1}")
        r = self.row(row)
        return r[shard * self.shard_bytes:(shard + 1) * self.shard_bytes]


class Region(_Rows):
    """The pool's region mapped into this process. Close it (or use `with`)
    after the memoryviews it handed out are released: the mapping refuses
    to close while any is alive (BufferError), so none can dangle."""

    def __init__(self, handle: int):
        self._h: Optional[int] = handle
        i = L.kvp_region_info(handle).contents
        self.path = i.path.decode()
        self.bytes, self.row_bytes, self.row_stride = i.bytes, i.row_bytes, i.row_stride
        self.num_rows, self.shards, self.shard_bytes = i.num_rows, i.shards, i.shard_bytes
        # The file kvp_region_open checked, not whatever the path names now.
        self._mm = mmap.mmap(L.kvp_region_fd(handle), self.bytes, mmap.MAP_SHARED)
        self._view = memoryview(self._mm)

    def check(self, row: int, crc: int) -> bool:
        """Whether the row's bytes have the CRC32C `crc` (from lookup_and_lock)."""
        return bool(self._h) and bool(L.kvp_region_check(self._h, row, crc))

    def crc(self, row: int) -> int:
        """The row's CRC32C, as Commit records it."""
        out = c_uint32(0)
        if not self._h or L.kvp_region_crc(self._h, row, byref(out)) != 0:
            raise IndexError(f"kvpool: row {row} is outside 1..{self.num_rows - 1}")
        return out.value

    def address(self, row: int) -> int:
        """Row `row`'s address in this process (for a transfer engine that
        reads or writes it in place; the mapping lives until close())."""
        if not self._h:
            raise ValueError("kvpool: the region is closed")
        p = L.kvp_region_row(self._h, row)
        if not p:
            raise IndexError(f"kvpool: row {row} is outside 1..{self.num_rows - 1}")
        return int(p)

    def ref(self) -> RegionRef:
        """This mapping's file, for another process of this host and user to
        map (adopt_region) while this Region is open, even after kvpoold is gone."""
        if not self._h:
            raise ValueError("kvpool: the region is closed")
        fd = L.kvp_region_fd(self._h)
        st = os.fstat(fd)
        return RegionRef(os.getpid(), fd, st.st_dev, st.st_ino, self.bytes, self.row_bytes,
                         self.row_stride, self.num_rows, self.shards, self.shard_bytes)

    def close(self) -> None:
        if self._h:
            self._view.release()
            self._mm.close()  # BufferError while a row's memoryview is alive
            L.kvp_region_close(self._h)
            self._h = None

    def __enter__(self) -> "Region":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except BufferError:
            pass


class RegionRef(NamedTuple):
    """A region held open by a process, for another process of the same host
    and user to map (Region.ref, adopt_region): through the holder's descriptor,
    so it stays mappable after kvpoold has gone and its file was unlinked."""
    pid: int
    fd: int
    dev: int
    ino: int
    bytes: int
    row_bytes: int
    row_stride: int
    num_rows: int
    shards: int
    shard_bytes: int


class AdoptedRegion(_Rows):
    """A region mapped through another process's descriptor (adopt_region): rows
    and shards as Region's; no checksum check (that needs a client)."""

    def __init__(self, ref: RegionRef):
        path = f"/proc/{ref.pid}/fd/{ref.fd}" if ref.pid != os.getpid() else None
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC) if path else os.dup(ref.fd)
        try:
            st = os.fstat(fd)
            if (not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (ref.dev, ref.ino)
                    or st.st_size != ref.bytes):
                raise FileNotFoundError(f"kvpool: descriptor {ref.fd} of process {ref.pid} is "
                                        "no longer the region it held")
            self._mm = mmap.mmap(fd, ref.bytes, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self._view = memoryview(self._mm)
        self.path = path or f"/proc/self/fd/{ref.fd}"
        self.bytes, self.row_bytes, self.row_stride = ref.bytes, ref.row_bytes, ref.row_stride
        self.num_rows, self.shards, self.shard_bytes = ref.num_rows, ref.shards, ref.shard_bytes

    def close(self) -> None:
        if self._view is not None:
            self._view.release()
            self._mm.close()  # BufferError while a row's memoryview is alive
            self._view = None

    def __enter__(self) -> "AdoptedRegion":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def adopt_region(ref: RegionRef) -> AdoptedRegion:
    """Maps the region another process holds (its Region.ref()), checked to
    be the very file it held (device, inode, size). OSError where it cannot
    be had: the holder is gone, or /proc does not let this process open its
    descriptors (another user, or another PID namespace)."""
    return AdoptedRegion(ref)


class RegionCalls:
    """Client's calls on the shared region (mixed into kvpool.Client)."""

    def _live(self) -> Any:  # Client's: its C handle, or raises when closed
        raise NotImplementedError

    def _check(self, rv: int) -> None:  # Client's: raises the status's exception
        raise NotImplementedError

    @property
    def key_len(self) -> int:
        """Bytes per key: the pool's hash_len + 4."""
        return int(L.kvp_client_key_len(self._live()))

    def region(self) -> Region:
        """Maps the pool's region (NotSupported if it has none, NotFound if its
        file is not on this host or not readable by this user)."""
        h = c_void_p()
        self._check(L.kvp_region_open(self._live(), byref(h)))
        if not h.value:
            raise RuntimeError("kvpool: kvp_region_open gave no region")
        try:
            return Region(h.value)
        except BaseException:
            L.kvp_region_close(h.value)
            raise

    def reserve(self, keys: Keys) -> tuple[list[int], list[bytes]]:
        """A row to write per key, or -1 where the key is already stored (or
        being stored); and the keys evicted to make room. All or nothing:
        NoSpace when too few rows can be had."""
        kl = self.key_len
        arr, n = _keys(keys, kl)
        rows = (c_int32 * max(n, 1))()
        ev = (c_uint8 * max(n * kl, 1))()
        ne = c_size_t(0)
        self._check(L.kvp_client_reserve(self._live(), arr, n, rows, ev, byref(ne)))
        raw = bytes(ev)[:ne.value * kl]
        return list(rows[:n]), [raw[i * kl:(i + 1) * kl] for i in range(ne.value)]

    def commit(self, keys: Keys, crcs: Optional[Sequence[int]] = None,
               checksum: bool = True) -> None:
        """Makes reserved keys visible, with each row's CRC32C: crcs (one per
        key), else (checksum) the daemon reads each row, else none (0)."""
        arr, n = _keys(keys, self.key_len)
        c = None
        if crcs is not None:
            if len(crcs) != n:
                raise ValueError(f"kvpool: {len(crcs)} checksums for {n} keys")
            c = (c_uint32 * max(n, 1))(*crcs)
        self._check(L.kvp_client_commit(self._live(), arr, n, c, checksum))

    def abort(self, keys: Keys) -> None:
        """Gives reserved rows back unseen."""
        arr, n = _keys(keys, self.key_len)
        self._check(L.kvp_client_abort(self._live(), arr, n))

    def lookup_and_lock(self, keys: Keys, prefix: bool = False) -> tuple[list[int], list[int]]:
        """(rows, crcs) per key: the row, locked until unlock(), or -1 for a
        miss (not locked), or -2 (pending: the pool's cluster tier is filling
        it, ask again); the CRC32C recorded at commit. With prefix, keys
        after the first miss are not looked up (-1)."""
        arr, n = _keys(keys, self.key_len)
        rows = (c_int32 * max(n, 1))()
        crcs = (c_uint32 * max(n, 1))()
        self._check(L.kvp_client_lookup_lock(self._live(), arr, n, prefix, rows, crcs, None,
                                             None))
        return list(rows[:n]), list(crcs[:n])

    def lookup_and_lock_uncounted(self, keys: Keys) -> tuple[list[int], list[int], list[int]]:
        """lookup_and_lock for the cluster tier's agent reading rows to put:
        (rows, crcs, hits) per key, where the lookup counts as no hit and
        hits is how many counted lookups hit the key's row since its commit
        (0 for a miss; a write-behind policy of blocks hit more than once)."""
        arr, n = _keys(keys, self.key_len)
        rows = (c_int32 * max(n, 1))()
        crcs = (c_uint32 * max(n, 1))()
        hits = (c_uint32 * max(n, 1))()
        self._check(L.kvp_client_lookup_lock_uncounted(self._live(), arr, n, rows, crcs, hits))
        return list(rows[:n]), list(crcs[:n]), list(hits[:n])

    def unlock(self, keys: Keys) -> None:
        """Releases this session's lock on each key's row."""
        arr, n = _keys(keys, self.key_len)
        self._check(L.kvp_client_unlock(self._live(), arr, n))

    def cluster_fill(self, absent: Keys = (), max_wants: int = 0) -> tuple[list[bytes], int]:
        """The cluster tier's agent (docs/cluster.md): reports the keys the
        cluster lacks and takes up to max_wants keys lookups missed since;
        (those keys, how many stay queued). NotSupported on a pool without
        cluster_wait_ms."""
        if not 0 <= max_wants < 1 << 32:
            raise ValueError(f"kvpool: max_wants {max_wants} is not a 32-bit count")
        arr, n = _keys(absent, self.key_len)
        kl = self.key_len
        out = (c_uint8 * max(max_wants * kl, 1))()
        got, waiting = c_size_t(0), c_uint32(0)
        self._check(L.kvp_client_cluster_fill(self._live(), arr, n, out, max_wants, byref(got),
                                              byref(waiting)))
        raw = bytes(out)
        return [raw[i * kl:(i + 1) * kl] for i in range(got.value)], waiting.value

    def cluster_announce(self, stored: Keys = (), removed: Keys = ()) -> None:
        """The cluster tier's agent: tells the pool the keys the cluster
        store now holds and those it no longer holds; the pool publishes
        them as medium CLUSTER events (docs/cluster.md, "Events").
        NotSupported on a pool without cluster_wait_ms."""
        s_arr, s_n = _keys(stored, self.key_len)
        r_arr, r_n = _keys(removed, self.key_len)
        self._check(L.kvp_client_cluster_announce(self._live(), s_arr, s_n, r_arr, r_n))
