# SPDX-License-Identifier: Apache-2.0
"""The shared region from Python, against a real kvpoold: rows written in
place here are read by another process through its own mapping; rows are
memoryviews NumPy wraps without a copy; locks, aborts and refusals."""
import hashlib
import os
import subprocess
import sys

import pytest

import kvpool

HERE = os.path.dirname(os.path.abspath(__file__))


def key(i, series=0, group=0):
    return kvpool.offload_key(hashlib.sha256(f"{series}/{i}".encode()).digest(), group)


def pattern(i, n):
    return hashlib.shake_256(f"row {i}".encode()).digest(n)


READER = r"""
import hashlib, sys
sys.path.insert(0, sys.argv[1])
import kvpool
url, n = sys.argv[2], int(sys.argv[3])
keys = [kvpool.offload_key(hashlib.sha256(f"7/{i}".encode()).digest(), 0) for i in range(n)]
with kvpool.Client(url, pool="kv") as c, c.region() as reg:
    rows, crcs = c.lookup_and_lock(keys)
    for i, (r, crc) in enumerate(zip(rows, crcs)):
        assert r > 0, rows
        assert reg.row(r) == hashlib.shake_256(f"row {i}".encode()).digest(reg.row_bytes), i
        assert reg.check(r, crc)
    c.unlock(keys)
print("ok", len(rows))
"""


def test_region_rows_cross_processes(daemon):
    with kvpool.Client(daemon, pool="kv") as c, c.region() as reg:
        assert c.info["region"]
        assert reg.row_bytes == c.info["executor"]["block_bytes"]
        assert reg.row_stride % 4096 == 0 and reg.num_rows == c.info["num_blocks"]
        keys = [key(i, 7) for i in range(4)]
        rows, evicted = c.reserve(keys)
        assert all(r > 0 for r in rows) and evicted == []
        for i, r in enumerate(rows):
            reg.row(r)[:] = pattern(i, reg.row_bytes)
        c.commit(keys)
        out = subprocess.run([sys.executable, "-c", READER, os.path.dirname(HERE), daemon, "4"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["ok", "4"]
        # stored: a second reserve gives no row
        assert c.reserve(keys)[0] == [-1] * 4


def test_region_rows_are_zero_copy_views(daemon):
    np = pytest.importorskip("numpy")
    with kvpool.Client(daemon, pool="kv") as c, c.region() as reg:
        keys = [key(0, 8)]
        (r,), _ = c.reserve(keys)
        a = np.frombuffer(reg.row(r), dtype=np.uint16)
        a[:] = np.arange(a.size, dtype=np.uint16)  # written through the view
        del a
        c.commit(keys)
        rows, crcs = c.lookup_and_lock(keys)
        assert rows == [r]
        assert bytes(reg.row(r)[:4]) == b"\x00\x00\x01\x00"
        assert reg.check(r, crcs[0])
        reg.row(r)[0] ^= 0xFF  # a writer that should not have: the check sees it
        assert not reg.check(r, crcs[0])
        c.unlock(keys)
        with pytest.raises(kvpool.NotOwner):
            c.unlock(keys)
        view = reg.row(r)
        with pytest.raises(BufferError):
            reg.close()  # no mapping goes while a row's view is alive
        view.release()


def test_region_prefix_lookup_and_abort(daemon):
    with kvpool.Client(daemon, pool="kv") as c:
        keys = [key(i, 9) for i in range(3)]
        rows, _ = c.reserve(keys[:1] + keys[2:])
        c.commit(keys[:1] + keys[2:])
        rows, crcs = c.lookup_and_lock(keys, prefix=True)
        assert rows[0] > 0 and rows[1:] == [-1, -1]
        c.unlock(keys[:1])
        rows, _ = c.reserve(keys[1:2])
        c.abort(keys[1:2])
        with pytest.raises(kvpool.NotFound):
            c.commit(keys[1:2])
        assert c.lookup_and_lock(keys[1:2])[0] == [-1]
        with pytest.raises(ValueError):
            c.reserve([b"short"])


def test_region_calls_in_a_batch_send_rows(daemon):
    """Batch.send_rows: each call's error or rows, as send() reports them;
    a key of the wrong length (even where the lengths add up) is refused."""
    with kvpool.Client(daemon, pool="kv") as c:
        keys = [key(i, 11) for i in range(3)]
        b = c.batch(keep_going=True)
        b.reserve(keys)
        b.commit(keys[:1])  # calls run in order: reserved by the first
        b.lookup_and_lock(keys[:1] + [key(99, 11)])
        b.abort(keys[2:])  # reserved above
        b.commit([key(98, 11)])  # never reserved: this call's own NOT_FOUND
        (e1, rows), (e2, _), (e3, found), (e4, _), (e5, _) = b.send_rows()
        assert e1 is None and all(r > 0 for r in rows) and len(rows) == 3
        assert e2 is None and e4 is None
        assert e3 is None and found[0] == rows[0] and found[1] == -1
        assert isinstance(e5, kvpool.NotFound)
        b.clear()
        b.unlock(keys[:1])
        b.abort(keys[1:2])
        assert [e for e, _ in b.send_rows()] == [None, None]
        b.close()
        k = keys[0]
        with pytest.raises(ValueError):
            c.reserve([k[:-1], k + b"x"])  # 2 keys' bytes, neither a key


def test_region_refused_without_one(daemon):
    with kvpool.Client(daemon, pool="bare") as c:
        assert not c.info["region"]
        with pytest.raises(kvpool.NotSupported):
            c.region()
        with pytest.raises(kvpool.NotSupported):
            c.reserve([key(0)])
