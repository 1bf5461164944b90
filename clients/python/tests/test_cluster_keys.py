# SPDX-License-Identifier: Apache-2.0
"""The cluster tier's keys and checks (kvpool.cluster_store), without a
store: object names under a namespace, the trailer a fill checks before a
row becomes KV (a foreign, stale or torn object is refused), and the refusal
of a public address (Mooncake Store has no authentication)."""
import os

import pytest

from kvpool.cluster import ClusterTier, TierConfig
from kvpool.cluster_store import (TRAILER, Namespace, StoreConfig, check_trailer, pack_trailer,
                                  private_address)

NS = Namespace("acme", "llama-3-8b", "bf16,h8,d128,l32,b16,tp0of1", 1 << 19, 1, 36)
KEY = bytes(range(32)) + b"\0\0\0\0"


def test_names_keep_namespaces_apart():
    other = [Namespace("other", NS.model, NS.layout, NS.row_bytes, 1, 36),
             Namespace(NS.tenant, "llama-3-70b", NS.layout, NS.row_bytes, 1, 36),
             Namespace(NS.tenant, NS.model, "fp16,h8,d128,l32,b16,tp0of1", NS.row_bytes, 1, 36),
             Namespace(NS.tenant, NS.model, NS.layout, NS.row_bytes, 2, 36)]
    names = {NS.name(KEY)} | {o.name(KEY) for o in other}
    assert len(names) == 5
    assert NS.name(KEY).startswith("kvpool/acme/") and NS.name(KEY).endswith(KEY.hex())
    assert NS.name(KEY) != NS.name(KEY[:-1] + b"\1")  # another group


def test_the_trailer_admits_only_this_namespace_and_key():
    t = pack_trailer(NS, KEY, 0xDEADBEEF)
    assert len(t) == TRAILER
    assert check_trailer(NS, KEY, t) == 0xDEADBEEF
    # a foreign namespace, another key, another row size, a torn or zeroed trailer
    assert check_trailer(Namespace("x", NS.model, NS.layout, NS.row_bytes, 1, 36), KEY, t) is None
    assert check_trailer(NS, KEY[:-1] + b"\1", t) is None
    assert check_trailer(Namespace(NS.tenant, NS.model, NS.layout, 4096, 1, 36), KEY, t) is None
    assert check_trailer(NS, KEY, t[:40]) is None
    assert check_trailer(NS, KEY, bytes(TRAILER)) is None
    flipped = bytearray(t)
    flipped[9] ^= 1  # inside the namespace digest
    assert check_trailer(NS, KEY, bytes(flipped)) is None


@pytest.mark.parametrize("addr,ok", [
    ("10.1.2.3", True), ("127.0.0.1:50051", True), ("192.168.0.9:8080", True),
    ("http://10.0.0.1:8080/metadata", True), ("[::1]:50051", True), ("169.254.1.1", True),
    ("8.8.8.8", False), ("http://1.1.1.1:8080/metadata", False), ("no-such-host.invalid", False)])
def test_private_addresses(addr, ok):
    assert private_address(addr) is ok


def test_the_agent_refuses_a_public_address_before_connecting():
    cfg = TierConfig(url="ipc:///nonexistent/kvpool.ipc", events="ipc:///nonexistent/ev.ipc",
                     model="m", layout="l",
                     store=StoreConfig(master="8.8.8.8:50051",
                                       metadata="http://10.0.0.1:8080/metadata",
                                       host="10.0.0.2"))
    with pytest.raises(ValueError, match="master address 8.8.8.8:50051 is not private"):
        ClusterTier(cfg)
    assert not os.path.exists("/nonexistent")


def _pins(tmp_path, text, **kw):
    from kvpool.cluster_pins import load_pins
    import kvpool
    p = tmp_path / "pins.jsonl"
    p.write_text(text)
    return load_pins(str(p), kvpool.Hasher(kvpool.Hasher.DEFAULT_SEED), kw.pop("per_hash", 4),
                     kw.pop("chunk", 1), kw.pop("groups", (0,)), **kw)


def test_a_pin_file_names_each_prompts_chunks_once(tmp_path):
    import kvpool
    from kvpool.cluster_pins import PinSet
    h = kvpool.Hasher(kvpool.Hasher.DEFAULT_SEED).hash_request(list(range(10)), 4)
    keys = _pins(tmp_path, "[0,1,2,3,4,5,6,7,8,9]\n# again\n[0,1,2,3,4,5,6,7,8,9]\n"
                 '{"tokens": [0,1,2,3]}\n')
    assert keys == [h[0] + b"\0\0\0\0", h[1] + b"\0\0\0\0"]  # 2 full blocks, each once
    assert _pins(tmp_path, "[0,1,2,3,4,5,6,7,8,9]\n", chunk=2) == [h[1] + b"\0\0\0\0"]
    assert _pins(tmp_path, "[0,1,2]\n") == []  # no full block
    salted = _pins(tmp_path, '{"tokens": [0,1,2,3], "cache_salt": "t-7"}\n')
    assert len(salted) == 1 and salted[0] != keys[0]
    pins = PinSet(keys, sweep_s=60.0, per_sweep=1)
    from collections import deque
    due, rest = pins.due(deque([b"x" * 36, keys[1]]))
    assert due == [keys[1], keys[0]] and list(rest) == [b"x" * 36]  # committed, then a sweep
    due, rest = pins.due(deque([keys[0]]))
    assert due == [keys[0]] and not rest  # the next sweep is a minute away


@pytest.mark.parametrize("text,why", [
    ("[0,1,\n", "not JSON"), ('{"tokens": [1], "lora": "x"}\n', "unknown fields"),
    ("[]\n", "non-empty list"), ('["a"]\n', "token ids"), ("[-1]\n", "token ids"),
    ('{"tokens": [1], "cache_salt": 7}\n', "strings"), ("7\n", "non-empty list")])
def test_a_bad_pin_file_line_is_refused_with_its_place(tmp_path, text, why):
    with pytest.raises(ValueError, match=f"pins.jsonl:1: .*{why}"):
        _pins(tmp_path, text)


def test_a_pin_file_past_its_limit_is_refused(tmp_path):
    with pytest.raises(ValueError, match="more than 3 pinned keys"):
        _pins(tmp_path, "[" + ",".join(map(str, range(40))) + "]\n", limit=3)


def test_the_agents_pin_flags_are_checked(tmp_path, capsys):
    from kvpool.cluster import _parse
    base = ["--url", "ipc:///x", "--events", "ipc:///y", "--master", "10.0.0.1:50051",
            "--metadata", "http://10.0.0.1:8080/metadata", "--host", "10.0.0.2",
            "--model", "m", "--layout", "l"]
    cfg, _ = _parse(base + ["--write-behind", "pinned", "--pin-file", "p.jsonl",
                            "--pin-hash-seed", "0", "--pin-groups", "0,2"])
    assert cfg.pinned_only and cfg.pin_file == "p.jsonl" and cfg.pin_seed == "0"
    assert cfg.pin_groups == (0, 2) and cfg.write_behind
    cfg, _ = _parse(base + ["--write-behind", "hits:2", "--pin-file", "p.jsonl"])
    assert cfg.min_hits == 2 and not cfg.pinned_only and cfg.pin_groups == (0,)
    for bad, why in ((["--write-behind", "pinned"], "needs --pin-file"),
                     (["--write-behind", "none", "--pin-file", "p"], "needs write-behind"),
                     (["--no-write-behind", "--pin-file", "p"], "needs write-behind"),
                     (["--pin-file", "p", "--pin-groups", "0,x"], "comma-separated"),
                     (["--pin-file", "p", "--pin-groups", "-1"], "0 to 2"),
                     (["--write-behind", "sometimes"], "pinned or none")):
        with pytest.raises(SystemExit):
            _parse(base + bad)
        assert why in capsys.readouterr().err, bad


class _MemStore:
    """A store's semantics as the announcement log relies on them (the real
    store runs in test_cluster): a put of an existing name writes nothing,
    a missing name reads as "", exists answers 1 or 0."""

    def __init__(self):
        self.objs = {}

    def call(self, op, names=(), data=(), **_):
        if op == "blob_put":
            for n, d in zip(names, data):
                self.objs.setdefault(n, d)
            return [0] * len(names)
        if op == "blob_upsert":
            self.objs.update(zip(names, data))
            return [0] * len(names)
        if op == "blob_get":
            return [self.objs.get(n, "") for n in names]
        if op == "blob_remove":
            return [0 if self.objs.pop(n, None) is not None else -704 for n in names]
        if op == "exists":
            return [int(n in self.objs) for n in names]
        raise ValueError(op)


class _Pool:
    def __init__(self):
        self.told = []

    def cluster_announce(self, stored=(), removed=()):
        self.told.append((list(stored), list(removed)))


def test_the_announcement_log_orders_writers_and_skips_gaps():
    import base64
    from kvpool.cluster_log import AnnounceLog, FleetEvents, pack_entry
    store = _MemStore()
    k = [bytes([i]) * 36 for i in range(8)]
    a, b = AnnounceLog(NS, gap_s=0.0), AnnounceLog(NS, gap_s=0.0)
    a.tell(stored=k[:2])
    b.tell(stored=k[2:3], removed=k[:1])
    a.write(store)
    b.write(store)  # b starts at the head a left (1): its entry goes to 2
    c = AnnounceLog(NS)
    assert a.read(store) == [(k[:2], []), (k[2:3], k[:1])]
    assert b.read(store) == [(k[2:3], k[:1])]  # what came before it joined is not its
    b2 = AnnounceLog(NS)
    b2.next = 1  # a writer that cannot take seq 2 (b's) takes the next
    b2.tell(stored=k[6:7])
    b2.write(store)
    assert store.objs[b2.name(3)] and a.read(store) == [(k[6:7], [])]
    assert c.read(store) == []  # a new reader starts after the head
    # A foreign object at the next seq, and an empty seq before a written one.
    other = Namespace("other", NS.model, NS.layout, NS.row_bytes, 1, 36)
    store.objs[a.name(4)] = base64.b64encode(pack_entry(other, b"n" * 16, k[3:4], [])).decode()
    a._claim = 6  # seq 5 stays empty, as after a writer that died mid-append
    a.tell(stored=k[4:5])
    a.write(store)
    assert b.read(store) == [(k[6:7], [])]  # 3, then 4 is foreign, 5 is empty
    assert b.read(store) == [(k[4:5], [])]  # 5 skipped (gap_s 0: at once), 6
    assert b.stats["log_foreign"] == 1 and b.stats["log_skipped"] == 1
    # FleetEvents: each key told once; a fill's gone key retracted; an audit
    # finds a put the store lost.
    store2, pool = _MemStore(), _Pool()
    f = FleetEvents(NS, audit_s=0.0)
    f.put(k[:3])
    f.put(k[:1])
    f.step(pool, store2, lambda: [])
    f.step(pool, store2, lambda: [])
    assert pool.told == [(k[:3], [])] and all(x in f for x in k[:3])
    f.gone(k[5:6])  # never announced: nothing to retract
    f.gone(k[1:2])
    f.step(pool, store2, lambda: [])
    assert pool.told[-1] == ([], k[1:2]) and k[1] not in f
    for key in (k[0], k[2]):
        store2.objs[NS.name(key)] = "x"
    del store2.objs[NS.name(k[2])]  # evicted
    f.step(pool, store2, lambda: [k[0], k[2]])  # the audit, then the log
    f.step(pool, store2, lambda: [])
    assert f.evicted == 1 and pool.told[-1] == ([], k[2:3]) and k[0] in f
    f2 = _Pool()
    f.retell(f2)  # a restarted kvpoold hears what is held
    assert f2.told == [([k[0]], [])]
