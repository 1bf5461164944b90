# SPDX-License-Identifier: Apache-2.0
"""kvpool's Python package against a real kvpoold over ipc://."""
import time

import pytest

import kvpool

BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 2  # layers x K,V x tokens x heads x head size x fp16


def test_hashes_are_vllms():
    # scenarios.md H0, H1, H2, H5, H6 (sha256_cbor, PYTHONHASHSEED=0): vLLM
    # 9aaf83ef5's, whose extra keys were untagged.
    h = kvpool.Hasher("0", algorithm="sha256_cbor", vllm="9aaf83ef5")
    assert h.none_hash.hex() == "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
    b = h.hash_request(range(32), 16)
    assert [x.hex() for x in b] == [
        "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c",
        "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac"]
    assert len(h.hash_request(range(47), 16)) == 2  # partial blocks are never hashed
    b = h.hash_request(range(8), 4, lora_name="L", cache_salt="S", mm=[("img", 2, 3)])
    assert [x.hex() for x in b] == [
        "2e22a72f505692bd4873ca3d4e0b019404e5cbaa6a9cb18cafba1662ecb8b859",
        "ae38ae0968b51d793c445e0331a86d8f5671fb01c02f0db4d90a0c83fd9c2fe9"]
    b = h.hash_request(range(8), 4, cache_salt="salt1")
    assert b[0].hex() == "95e6875f935c12800a594290e439ee8ce2d8a9b262ac6b3712e78bfb506376df"
    with pytest.raises(kvpool.InvalidArgument):
        h.hash_request(range(8), 4, lora_name="x" * 1025)
    # vLLM 0.33's tagged keys (tests/vllm/golden_keys.py, case ALL): LoRA L at /p.
    t = kvpool.Hasher("0", algorithm="sha256_cbor")
    b = t.hash_request(range(8), 4, lora_name="L", lora_path="/p", cache_salt="S",
                       mm=[("img", 2, 3)])
    assert [x.hex() for x in b] == [
        "3fc0cb18daaebd7927762b5cd0b8add2e87a28c32dc6794e76f722ddff782bf8",
        "74f049b8d64653c9afdfeaf7e2fd69246433c4ece2a6fc3bdc9487999e4f96af"]
    with pytest.raises(kvpool.InvalidArgument):
        t.hash_request(range(8), 4, lora_name="L")  # vLLM 0.33 hashes the path too
    with pytest.raises(ValueError):
        kvpool.Hasher("0", vllm="0.34")


def test_exceptions_follow_the_c_status_table():
    # One class per status, named after its wire name (NO_SPACE -> NoSpace), so the
    # hand-written classes cannot drift from common/kvp_status.h.
    from kvpool import _lib
    codes = [code for code in range(1, 64)
             if _lib.kvp_status_wire_name(code) not in (None, b"", b"?")
             and _lib.kvp_strerror(code) != b"unknown status"]
    assert sorted(kvpool.BY_STATUS) == codes
    for code in codes:
        wire = _lib.kvp_status_wire_name(code).decode()
        camel = "".join(w.capitalize() for w in wire.split("_"))
        assert kvpool.BY_STATUS[code].__name__ == camel, wire
        assert kvpool.BY_STATUS[code].status == code


def test_session_info_and_blocks(daemon):
    with kvpool.Client(daemon, pool="kv") as c:
        assert c.info["pool"] == "kv"
        assert c.info["num_blocks"] == 64 and c.info["block_size"] == 16
        assert c.info["server_version"].startswith(kvpool.__version__)  # one version
        assert c.info["executor"]["backend"] == "cpu"
        assert c.info["executor"]["block_bytes"] == BLOCK_BYTES
        free0 = c.stats()["num_free"]
        ids = c.allocate(5)
        assert len(set(ids)) == 5 and 0 not in ids  # block 0 is the null block
        assert c.stats()["num_free"] == free0 - 5
        c.touch(ids[:2])
        c.free(ids[:2])
        c.free(ids)
        assert c.stats()["num_free"] == free0


def test_refusals_raise_typed_errors(daemon):
    with kvpool.Client(daemon, pool="kv") as c, kvpool.Client(daemon, pool="kv") as other:
        with pytest.raises(kvpool.NoSpace) as e:
            c.allocate(64)  # 63 usable blocks
        assert e.value.status == 2 and e.value.detail
        mine = c.allocate(1)
        with pytest.raises(kvpool.NotOwner):
            other.free(mine)
        with pytest.raises(kvpool.OutOfRange):
            c.touch([1000])
        c.free(mine)
    with pytest.raises(kvpool.UnknownPool):
        kvpool.Client(daemon, pool="no-such-pool")
    with kvpool.Client(daemon, pool="bare") as b, pytest.raises(kvpool.NotSupported):
        b.read_blocks(b.allocate(1))
    c = kvpool.Client(daemon, pool="kv")
    c.close()
    c.close()  # idempotent
    with pytest.raises(kvpool.KvpoolError):
        c.allocate(1)


def test_no_daemon_is_unavailable_with_the_reason(tmp_path):
    url = f"ipc://{tmp_path}/nobody.ipc"
    t0 = time.monotonic()
    with pytest.raises(kvpool.Unavailable) as e:
        kvpool.Client(url, connect_timeout_ms=200)
    assert time.monotonic() - t0 < 2.0
    assert isinstance(e.value, ConnectionError)
    assert "no kvpoold listening" in str(e.value) and url in str(e.value)


def test_open_refusals_carry_the_daemons_reason(daemon):
    with pytest.raises(kvpool.Unauthenticated) as e:
        kvpool.Client(daemon, pool="kv", session_id=12345)
    assert "never opened here" in str(e.value)


def test_data_plane_buffers(daemon):
    np = pytest.importorskip("numpy")
    with kvpool.Client(daemon, pool="kv") as c:
        ids = c.allocate(3)
        payload = bytes((i * 7) & 0xFF for i in range(3 * BLOCK_BYTES))
        c.write_blocks(ids, payload)                      # from bytes
        assert bytes(c.read_blocks(ids)) == payload       # into a new bytearray
        out = np.zeros(3 * BLOCK_BYTES // 2, dtype=np.float16)
        assert c.read_blocks(ids, out) is out             # into a NumPy array, in place
        assert out.tobytes() == payload
        arr = np.frombuffer(payload, dtype=np.uint8)[::-1].copy()
        arr.flags.writeable = False
        c.write_blocks(ids, arr)                          # from a read-only NumPy array
        mv = memoryview(bytearray(3 * BLOCK_BYTES))
        c.read_blocks(ids, mv)
        assert bytes(mv) == payload[::-1]
        c.copy_blocks(ids[:1], ids[1:2])
        assert bytes(c.read_blocks(ids[1:2])) == payload[::-1][:BLOCK_BYTES]
        with pytest.raises(kvpool.InvalidArgument):
            c.read_blocks(ids, bytearray(10))             # wrong size
        with pytest.raises(TypeError):
            c.read_blocks(ids, bytes(3 * BLOCK_BYTES))    # read-only destination
        c.free(ids)


def test_torch_tensors(daemon):
    torch = pytest.importorskip("torch")
    with kvpool.Client(daemon, pool="kv") as c:
        ids = c.allocate(2)
        src = torch.arange(2 * BLOCK_BYTES // 2, dtype=torch.int16)
        c.write_blocks(ids, src)
        dst = torch.empty(2 * BLOCK_BYTES // 2, dtype=torch.bfloat16)
        c.read_blocks(ids, dst)
        assert torch.equal(dst.view(torch.int16), src)
        c.free(ids)


def test_prefix_cache_and_requests(daemon):
    prompt = list(range(1000, 1040))  # 2 full blocks of 16 and 8 more
    with kvpool.Client(daemon, pool="kv") as c, kvpool.Client(daemon, pool="kv") as d:
        r = c.allocate_slots(1, prompt=prompt)
        assert len(r.new_blocks) == 3 and r.num_scheduled_tokens == 40
        ids, hit = d.lookup(prompt)
        assert (ids, hit) == (r.new_blocks[:2], 32)       # the 2 full blocks are cached
        r2 = d.allocate_slots(2, prompt=prompt)
        assert r2.hit_tokens == 32
        got, hit = d.get_computed_blocks(2)
        assert got[:2] == r.new_blocks[:2] and hit == 32
        with pytest.raises(kvpool.NotFound):
            d.free_request(99)
        d.free_request(2)
        c.free_request(1)
        assert c.stats()["active_requests"] == 0
        # Cache by hand, with extra keys: only the same keys hit.
        blocks = c.allocate(2)
        toks = list(range(5000, 5032))
        assert c.cache(blocks, toks, 2, lora_name="L", lora_path="/a/L") == 2
        assert d.lookup(toks, lora_name="L", lora_path="/a/L") == (blocks, 32)
        assert d.lookup(toks, lora_name="L", lora_path="/a/L2") == ([], 0)
        assert d.lookup(toks) == ([], 0)
        c.free(blocks)


def test_a_connector_fills_its_requests_blocks(daemon):
    """Blocks a request got from allocate_slots are this session's to write
    (vLLM's KV connector loads into them); another session's are not."""
    import numpy as np
    with kvpool.Client(daemon, pool="kv") as c, kvpool.Client(daemon, pool="kv") as d:
        r = c.allocate_slots(901, prompt=list(range(900000, 900020)))
        tail = r.new_blocks[-1:]  # the partial block: not cached
        data = np.arange(BLOCK_BYTES, dtype=np.uint8)
        c.write_blocks(tail, data)
        assert bytes(c.read_blocks(tail)) == data.tobytes()
        with pytest.raises(kvpool.NotOwner):
            d.write_blocks(tail, data)
        c.free_request(901)
        with pytest.raises(kvpool.NotOwner):
            c.write_blocks(tail, data)


def test_hybrid_pool_groups_and_blocks_by_group(daemon):
    """A gpt-oss-like pool: Hello's groups, and new blocks split by group."""
    with kvpool.Client(daemon, pool="gptoss") as c:
        assert c.info["prefix_caching"] is True
        assert c.info["groups"] == [
            {"kind": "full_attention", "block_size": 16},
            {"kind": "sliding_window", "block_size": 16, "sliding_window": 32}]
        prompt = [i // 16 for i in range(48)] + [3] * 7
        r = c.allocate_slots(1, prompt=prompt)
        assert r.new_blocks_by_group == [[1, 2, 3, 4], [5, 6, 7, 8]]
        r = c.allocate_slots(2, prompt=prompt[:53])
        assert r.hit_tokens == 48 and r.new_blocks_by_group == [[9], [10]]
        c.free_request(2, preempt=True)
        ids, hit = c.get_computed_blocks(2)
        assert hit == 48 and ids == [1, 2, 3, 0, 6, 7]


def test_the_readme_example_runs(daemon):
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    ex = os.path.join(os.path.dirname(here), "examples", "scheduler_and_handoff.py")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(here))
    out = subprocess.run([sys.executable, ex, daemon, "dflt"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "req-1: prefix hit 64 tokens" in out.stdout  # the shared system prompt
    assert "admitted 4 in one step: prefix hits [64, 64, 64, 64] tokens" in out.stdout
    assert "byte for byte" in out.stdout and "freed every request" in out.stdout


def test_check_hasher_warns_once_on_a_different_seed(daemon):
    """A pool's NONE_HASH fingerprint is in info, and a hasher that differs
    (zero hits, no error anywhere else) is caught, with one warning."""
    import warnings
    with kvpool.Client(daemon, pool="dflt") as c:
        assert len(c.info["none_hash_fingerprint"]) == 8
        good = kvpool.Hasher(kvpool.Hasher.DEFAULT_SEED)
        assert good.fingerprint == c.info["none_hash_fingerprint"]
        assert c.check_hasher(good)
        bad = kvpool.Hasher("some-other-seed")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert not c.check_hasher(bad)
            assert not c.check_hasher(bad)
        assert len(w) == 1 and "no prefix will hit" in str(w[0].message)
        assert not c.check_hasher(kvpool.Hasher(kvpool.Hasher.DEFAULT_SEED, "sha256_cbor"))


def test_one_client_shared_by_threads(daemon):
    """Four threads on one Client: every call answered, nothing corrupted."""
    import threading
    errors = []
    with kvpool.Client(daemon, pool="kv") as c:
        free0 = c.stats()["num_free"]

        def work():
            try:
                for _ in range(100):
                    ids = c.allocate(2)
                    c.touch(ids)
                    c.free(ids)
                    c.free(ids)
                    c.stats()
            except Exception as e:  # noqa: BLE001 - the test reports any failure
                errors.append(e)
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert c.stats()["num_free"] == free0


def test_clear_alloc_zeroes_what_the_last_tenant_left(tmp_path):
    """By default a freed block keeps its bytes and the next allocator can read
    them, as in vLLM; a pool with clear=alloc hands every block out zeroed."""
    from conftest import start, stop
    proc, url, _ = start(tmp_path, "--kv-layers", "1", "--kv-heads", "1", "--kv-head-size", "8",
                         "--pool", "name=keep,blocks=4,block_size=4",
                         "--pool", "name=clear,blocks=4,block_size=4,clear=alloc", pool="keep")
    try:
        for pool, leaks in (("keep", True), ("clear", False)):
            with kvpool.Client(url, pool=pool) as a, kvpool.Client(url, pool=pool) as b:
                ids = a.allocate(3)
                secret = bytes(range(1, 256)) * 64
                bb = a.info["executor"]["block_bytes"]
                a.write_blocks(ids, (secret * (3 * bb // len(secret) + 1))[:3 * bb])
                a.free(ids)  # uncached: reused first
                got = b.allocate(3)
                assert sorted(got) == sorted(ids)
                seen = bytes(b.read_blocks(got))
                assert (seen != bytes(len(seen))) == leaks, pool
                b.free(got)
    finally:
        stop(proc)


def test_every_status_has_one_name_and_derived_spellings():
    """One canonical name per status (the wire's, as kvpoolctl, the log and
    the metrics show it); Python's class is that name in CamelCase and the
    exception carries the name itself."""
    from kvpool import _lib as L, errors
    from kvpool.client import _raise
    for n in range(1, 17):
        wire = L.kvp_status_wire_name(n).decode()
        cls = errors.BY_STATUS[n]
        assert cls.__name__ == "".join(w.capitalize() for w in wire.split("_")), (n, wire)
        with pytest.raises(cls) as e:
            _raise(n, "why")
        assert e.value.name == wire and str(e.value) == f"{wire}: why"
