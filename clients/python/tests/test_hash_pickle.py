# SPDX-License-Identifier: Apache-2.0
"""vLLM's `sha256` hash algorithm (SHA-256 of pickle protocol 5) against CPython's
own pickle: the C encoder must give the same digest for every shape vLLM hashes."""
import hashlib
import pickle
import random

import pytest

import kvpool


def ref_none_hash(seed):
    return hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def ref_extra(start, end, lora, salt, mm, idx):
    """vLLM's generate_block_hash_extra_keys (spec 6.6) for lora, mm and salt."""
    keys = [lora] if lora is not None else []
    if mm and mm[-1][1] + mm[-1][2] >= start:
        cur = idx if idx >= 0 else len(mm) + idx
        while cur < len(mm):
            ident, off, length = mm[cur]
            if not end > off:
                break
            if start > off + length:
                cur += 1
                continue
            keys.append((ident, off - start))
            if end >= off + length:
                cur += 1
            else:
                break
        idx = cur
    if start == 0 and salt:
        keys.append(salt)
    return (tuple(keys) if keys else None), idx


def ref_hashes(seed, tokens, bs, lora=None, salt=None, mm=None):
    parent, out, idx = ref_none_hash(seed), [], 0
    for b in range(len(tokens) // bs):
        extra, idx = ref_extra(b * bs, (b + 1) * bs, lora, salt, mm or [], idx)
        obj = (parent, tuple(tokens[b * bs:(b + 1) * bs]), extra)
        parent = hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
        out.append(parent)
    return out


def test_sha256_vectors_h0_h1_h2():
    # scenarios.md H0-H2, sha256 (pickle), PYTHONHASHSEED=0.
    h = kvpool.Hasher("0", algorithm="sha256")
    assert h.none_hash.hex() == "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c"
    assert [x.hex() for x in h.hash_request(range(32), 16)] == [
        "6358e31578a64b75ebe28cdb99d3beae65de82a2087321dc6ec84ae048faaaa6",
        "3c3c50f324aefbdfbb124dfdc541efac3e94e59c40f4be08afe70601eeca92c8"]


def test_unknown_and_unimplemented_algorithms_are_refused():
    with pytest.raises(kvpool.NotSupported):
        kvpool.Hasher("0", algorithm="xxhash")
    with pytest.raises(kvpool.InvalidArgument):
        kvpool.Hasher("0", algorithm="md5")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sha256_matches_cpython_pickle_on_random_requests(seed):
    rnd = random.Random(seed)
    print("seed", seed)
    widths = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**40, 2**63 - 1]
    for case in range(200):
        bs = rnd.choice([1, 2, 3, 4, 5, 16, 64])
        n = bs * rnd.randint(0, 5) + rnd.randint(0, bs - 1)
        toks = []
        for _ in range(n):
            v = rnd.choice(widths) + rnd.randint(-3, 3)
            v = max(min(v, 2**63 - 1), -2**63)
            toks.append(v if rnd.random() < 0.8 else -v - 1)
        lora = rnd.choice([None, "lora-a", "l" * 300])
        salt = rnd.choice([None, "", "salt-b", "s" * 256])
        mm = []
        off = rnd.randint(0, 6)
        for i in range(rnd.randint(0, 3)):
            length = rnd.randint(1, 9)
            mm.append(("img%d" % i * rnd.randint(1, 90), off, length))
            off += length + rnd.randint(0, 5)
        h = kvpool.Hasher(str(seed), algorithm="sha256")
        got = h.hash_request(toks, bs, lora_name=lora, cache_salt=salt,
                             mm=mm or None)
        want = ref_hashes(str(seed), toks, bs, lora, salt, mm)
        assert got == want, (case, bs, toks, lora, salt, mm)


def test_sha256_matches_cpython_across_64k_frames():
    # A block whose pickle exceeds 64 KiB is split into frames exactly where CPython
    # splits it (after the object that fills a frame).
    for bs, base in ((14000, 70000), (40000, 7), (13100, 2**31 - 5), (7000, 2**40)):
        toks = [base + (i % 3) for i in range(bs)]
        h = kvpool.Hasher("0", algorithm="sha256")
        assert h.hash_request(toks, bs, lora_name="x" * 1000) == \
            ref_hashes("0", toks, bs, lora="x" * 1000), bs
