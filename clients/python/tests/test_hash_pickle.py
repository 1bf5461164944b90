# SPDX-License-Identifier: Apache-2.0
"""vLLM's `sha256` and `xxhash` hash algorithms (SHA-256 or XXH3-128 of pickle
protocol 5) against CPython's own pickle: the C encoder must give the same digest
for every shape vLLM hashes. The XXH3-128 reference is Debian's libxxhash.so.0
called through ctypes (kvpool compiles the header in instead), in the canonical
big-endian form python-xxhash's xxh3_128_digest returns."""
import ctypes
import hashlib
import pickle
import random

import pytest

import kvpool


class _XXH128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


_xxh = ctypes.CDLL("libxxhash.so.0")
_xxh.XXH3_128bits.restype = _XXH128
_xxh.XXH3_128bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3_128_digest(data):
    h = _xxh.XXH3_128bits(data, len(data))
    return h.high64.to_bytes(8, "big") + h.low64.to_bytes(8, "big")


def sha256_digest(data):
    return hashlib.sha256(data).digest()


def ref_none_hash(seed, digest=sha256_digest):
    return digest(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL))


def ref_extra(start, end, lora, salt, mm, idx, path=None):
    """vLLM's generate_block_hash_extra_keys for lora, mm and salt: vLLM 0.33's
    tagged keys when path is given (the LoRA's path, "" without a LoRA), else
    the plain keys of vLLM 9aaf83ef5 (spec 6.6). The tags are literals here,
    one object each, as in vLLM's code: CPython's pickle writes a repeated tag
    as a memo reference."""
    tagged = path is not None
    keys = []
    if lora is not None:
        keys.append(("lora", lora, path) if tagged else lora)
    if mm and mm[-1][1] + mm[-1][2] > start:
        cur = idx if idx >= 0 else len(mm) + idx
        while cur < len(mm):
            ident, off, length = mm[cur]
            if not end > off:
                break
            if start >= off + length:
                cur += 1
                continue
            keys.append(("mm", ident, off - start) if tagged else (ident, off - start))
            if end >= off + length:
                cur += 1
            else:
                break
        idx = cur
    if start == 0 and salt:
        keys.append(("cache_salt", salt) if tagged else salt)
    return (tuple(keys) if keys else None), idx


def ref_hashes(seed, tokens, bs, lora=None, salt=None, mm=None, digest=sha256_digest, path=None):
    parent, out, idx = ref_none_hash(seed, digest), [], 0
    for b in range(len(tokens) // bs):
        extra, idx = ref_extra(b * bs, (b + 1) * bs, lora, salt, mm or [], idx, path)
        obj = (parent, tuple(tokens[b * bs:(b + 1) * bs]), extra)
        parent = digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        out.append(parent)
    return out


def test_sha256_vectors_h0_h1_h2():
    # scenarios.md H0-H2, sha256 (pickle), PYTHONHASHSEED=0.
    h = kvpool.Hasher("0", algorithm="sha256")
    assert h.none_hash.hex() == "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c"
    assert [x.hex() for x in h.hash_request(range(32), 16)] == [
        "6358e31578a64b75ebe28cdb99d3beae65de82a2087321dc6ec84ae048faaaa6",
        "3c3c50f324aefbdfbb124dfdc541efac3e94e59c40f4be08afe70601eeca92c8"]


def test_unknown_algorithms_are_refused():
    for name in ("md5", "SHA256", "xxhash_msgpack", ""):
        with pytest.raises(kvpool.InvalidArgument):
            kvpool.Hasher("0", algorithm=name)


def test_xxhash_is_16_bytes_with_a_random_none_hash_of_32():
    # vLLM: NONE_HASH = hash_fn(seed), or os.urandom(32) whatever the algorithm.
    assert kvpool.Hasher("0", algorithm="xxhash").none_hash == \
        ref_none_hash("0", xxh3_128_digest)
    h = kvpool.Hasher(None, algorithm="xxhash")
    assert len(h.none_hash) == 32 and h.hash_len == 16
    assert all(len(x) == 16 for x in h.hash_request(range(64), 16))


@pytest.mark.parametrize("vllm", ["0.33", "9aaf83ef5"])
@pytest.mark.parametrize("algo,digest,seed", [("sha256", sha256_digest, 1),
                                              ("sha256", sha256_digest, 2),
                                              ("sha256", sha256_digest, 3),
                                              ("xxhash", xxh3_128_digest, 1),
                                              ("xxhash", xxh3_128_digest, 2)])
def test_pickle_algorithms_match_cpython_on_random_requests(algo, digest, seed, vllm):
    rnd = random.Random(seed)
    print("seed", seed, "vllm", vllm)
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
        # Several images often share a block: the tagged form's "mm" tag repeats.
        path = None if lora is None else "/adapters/" + lora[:8]
        h = kvpool.Hasher(str(seed), algorithm=algo, vllm=vllm)
        got = h.hash_request(toks, bs, lora_name=lora, cache_salt=salt,
                             mm=mm or None, lora_path=path if vllm == "0.33" else None)
        want = ref_hashes(str(seed), toks, bs, lora, salt, mm, digest,
                          (path or "") if vllm == "0.33" else None)
        assert got == want, (case, bs, toks, lora, salt, mm)


def test_sha256_matches_cpython_across_64k_frames():
    # A block whose pickle exceeds 64 KiB is split into frames exactly where CPython
    # splits it (after the object that fills a frame).
    for bs, base in ((14000, 70000), (40000, 7), (13100, 2**31 - 5), (7000, 2**40)):
        toks = [base + (i % 3) for i in range(bs)]
        h = kvpool.Hasher("0", algorithm="sha256")
        assert h.hash_request(toks, bs, lora_name="x" * 1000, lora_path="/p") == \
            ref_hashes("0", toks, bs, lora="x" * 1000, path="/p"), bs
