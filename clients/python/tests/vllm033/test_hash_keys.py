# SPDX-License-Identifier: Apache-2.0
"""Extra keys (LoRA, multimodal, cache salt) against the installed vLLM 0.33:
its tagged block-hash keys, hashed by vLLM's own request hasher, by
kvpool.Hasher and by kvpoold, with every hash algorithm; and the untagged
event form vLLM's BlockPool publishes, from RemoteBlockPool."""
import io
import json
import os
import random
import sys
from contextlib import redirect_stdout
from types import SimpleNamespace

import pytest

vllm = pytest.importorskip("vllm")
if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"these tests pin vLLM 0.33, not {vllm.__version__}", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "vllm"))

from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import PlaceholderRange  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core import kv_cache_utils as vku  # noqa: E402
from vllm.v1.core.block_pool import BlockPool  # noqa: E402

import kvpool  # noqa: E402
from kvpool.vllm import RemoteBlockPool  # noqa: E402

from conftest import start, stop  # noqa: E402

ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]


def test_golden_table_is_the_installed_vllms():
    """tests/test_block_hash.c pins vLLM 0.33's tagged-key hashes; they are
    still what the installed vLLM computes."""
    import golden_keys
    out = io.StringIO()
    with redirect_stdout(out):
        golden_keys.main()
    with open(os.path.join(ROOT, "tests", "test_block_hash.c")) as f:
        pinned = f.read()
    lines = out.getvalue().splitlines()
    assert len(lines) == 24
    for line in lines:
        assert line in pinned, line


class _Feature:
    """vLLM's MultiModalFeatureSpec as its hasher and BlockPool read it."""

    def __init__(self, identifier, offset, length):
        self.identifier = identifier
        self.mm_position = PlaceholderRange(offset=offset, length=length)


def _random_keys(rnd, ntok):
    """A LoRA (name, path), sorted non-overlapping images (several in one block
    at times, one ending exactly at a block's start at times), a salt."""
    lora = None
    if rnd.random() < 0.5:
        name = rnd.choice(["sql-lora", "L", "x" * 70])
        lora = (name, "/adapters/" + rnd.choice(["a", "b", "c" * 40]))
    salt = rnd.choice([None, None, "", "tenant-7", "s" * 300])
    mm, off = [], rnd.randint(0, 5)
    while off < ntok and len(mm) < 6 and rnd.random() < 0.7:
        length = rnd.randint(1, 12)
        mm.append(("img-%d-%s" % (len(mm), "h" * rnd.randint(1, 64)), off, length))
        off += length + rnd.choice([0, 0, 1, 3, 8])
    return lora, salt, mm


def _vllm_request(ntok, lora, salt, mm):
    return SimpleNamespace(
        all_token_ids=list(range(7000, 7000 + ntok)), num_tokens=ntok, block_hashes=[],
        lora_request=LoRARequest(lora[0], 3, lora[1]) if lora else None,
        mm_features=[_Feature(*m) for m in mm], cache_salt=salt, prompt_embeds=None,
        _prompt_embeds_per_block_hashes={}, session_id=None)


def _seeded(monkeypatch, algo):
    """vLLM's hash function for algo with NONE_HASH from PYTHONHASHSEED=0,
    and a random generator whose seed is printed (and returned)."""
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    fn = get_hash_fn_by_name(algo)
    vku.init_none_hash(fn)
    seed = random.randrange(1 << 30)
    print("seed", seed)
    return fn, random.Random(seed), seed


def _vllm_hash_incrementally(rnd, req, block_size, fn):
    """vLLM's request hasher as the engine calls it: as tokens arrive."""
    hasher = vku.get_request_block_hasher(block_size, fn)
    total, tokens = req.num_tokens, req.all_token_ids
    n = 0
    while n < total:
        n = min(total, n + rnd.randint(1, 3 * block_size))
        req.all_token_ids, req.num_tokens = tokens[:n], n
        req.block_hashes += hasher(req)
    return req.block_hashes


@pytest.mark.parametrize("algo", ALGOS)
def test_random_keyed_requests_hash_as_vllm(tmp_path, monkeypatch, algo):
    """Random LoRA / multimodal / salted requests: vLLM 0.33's hashes (as the
    engine extends them) equal kvpool.Hasher's, and kvpoold, hashing the
    same tokens and keys, caches blocks that vLLM's hashes find."""
    fn, rnd, seed = _seeded(monkeypatch, algo)
    proc, url, _ = start(tmp_path, "--pool",
                         f"name=k,blocks=256,block_size=4,executor=none,seed=0,hash_algo={algo}",
                         pool="k")
    try:
        ours = kvpool.Hasher("0", algorithm=algo)
        with kvpool.Client(url, pool="k") as c:
            for case in range(60):
                ntok = rnd.randint(4, 40)
                lora, salt, mm = _random_keys(rnd, ntok)
                req = _vllm_request(ntok, lora, salt, mm)
                tokens = list(req.all_token_ids)
                want = _vllm_hash_incrementally(rnd, req, 4, fn)
                keys = dict(lora_name=lora[0] if lora else None,
                            lora_path=lora[1] if lora else None, cache_salt=salt,
                            mm=mm or None)
                got = ours.hash_request(tokens, 4, **keys)
                assert got == want, (seed, case, lora, salt, mm)
                ids = c.allocate(len(want))
                assert c.cache(ids, tokens, len(want), **keys) == len(want), (seed, case)
                assert c.lookup_hashes(want)[0] == [ids], (seed, case, lora, salt, mm)
                c.free(ids)
                c.evict(ids)
    finally:
        stop(proc)


def test_keyed_events_are_vllms_block_pools(tmp_path, monkeypatch):
    """A LoRA, multimodal, salted request cached in two steps (the second
    from num_cached_blocks > 0, one image ending where that block starts)
    and reported reused: RemoteBlockPool publishes exactly vLLM's events,
    extra keys in vLLM's untagged event form."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    fn = get_hash_fn_by_name("sha256")
    vku.init_none_hash(fn)
    proc, url, ev = start(tmp_path, "--pool", "name=e,blocks=16,block_size=4,executor=none",
                          pool="e", events=True)
    try:
        mm = [("img-a", 1, 7), ("img-b", 10, 2), ("img-c", 12, 3)]
        req = _vllm_request(16, ("L", "/adapters/L"), "salt-1", mm)
        req.block_hashes = vku.get_request_block_hasher(4, fn)(req)
        theirs = BlockPool(16, True, 4, enable_kv_cache_events=True)
        with kvpool.Client(url, pool="e") as c:
            ours = RemoteBlockPool(c, True, events_url=ev)
            try:
                for pool in (theirs, ours):
                    blocks = pool.get_new_blocks(4)
                    pool.cache_full_blocks(req, blocks, 0, 2, 4, 0)
                    pool.cache_full_blocks(req, blocks, 2, 4, 4, 0)
                    pool.emit_cached_block_events(req, 3, 4, 0)
                    pool.free_blocks(reversed(blocks))
                want, got = theirs.take_events(), ours.take_events()
            finally:
                ours.close()
        assert len(want) == 3
        assert want[1].extra_keys[0] == ("L", ("img-b", 2))  # not img-a: it ended at 8
        assert got == want
    finally:
        stop(proc)


@pytest.mark.parametrize("algo", ALGOS)
def test_pinned_prompts_are_vllms_offload_keys(tmp_path, monkeypatch, algo):
    """The cluster tier's pinned prefixes (kvpool.cluster_pins): a pin file's
    prompts, LoRA and salted ones included, give the offload keys vLLM 0.33's
    offloading scheduler makes of the same requests (each chunk's last block
    hash and its group), for chunks of 1 and 3 hash blocks."""
    from vllm.v1.kv_offload.base import make_offload_key

    from kvpool.cluster_pins import load_pins
    fn, rnd, seed = _seeded(monkeypatch, algo)
    prompts, hashes = [], []
    for _ in range(20):
        ntok = rnd.randint(4, 60)
        lora, salt, _ = _random_keys(rnd, ntok)
        req = _vllm_request(ntok, lora, salt, [])
        hashes.append(list(_vllm_hash_incrementally(rnd, req, 4, fn)))
        item = {"tokens": list(range(7000, 7000 + ntok))}
        if lora:
            item.update(lora_name=lora[0], lora_path=lora[1])
        if salt is not None:
            item["cache_salt"] = salt
        prompts.append(item)
    path = tmp_path / "pins.jsonl"
    path.write_text("# pinned prefixes\n\n" + "\n".join(json.dumps(p) for p in prompts) + "\n")
    for chunk in (1, 3):
        want = {}
        for hs in hashes:
            for g in (0, 2):
                for i in range(chunk - 1, len(hs), chunk):
                    want[bytes(make_offload_key(hs[i], g))] = None
        got = load_pins(str(path), kvpool.Hasher("0", algorithm=algo), 4, chunk, (0, 2))
        assert sorted(got) == sorted(want), (seed, chunk)
